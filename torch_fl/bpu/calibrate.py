"""Public calibration API: observe sample inputs, feed the scales into every partition.

The scales also go into the calibration store (conversion/calibration_store.py), keyed by each
partition's graph, weights and method, so a recompile (`torch._dynamo.reset()`, a guard
failure, a new batch size) or a new process using the same cache finds them again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from torch_fl.bpu.conversion import calibration_store as stored
from torch_fl.bpu.conversion.calibration import Calibration, RangeObserver, health
from torch_fl.bpu.errors import CalibrationError, CalibrationRunError
from torch_fl.bpu.runtime import partition as runtime
from torch_fl.bpu.settings import parse_option
from torch_fl.host_view import cpu_views


class _Session:
    def __init__(self, method: str, percentile: float) -> None:
        self.method = method
        self.percentile = percentile
        self.observers: dict[int, tuple[runtime.PartitionRuntime, RangeObserver]] = {}
        self.keys: dict[int, stored.Keys] = {}
        self.counts: dict[int, int] = {}

    def observe(self, part: runtime.PartitionRuntime, args) -> None:
        from torch_fl.bpu.build import export_float

        if runtime._has_zero_size(args, part.entry.outputs):
            return  # an empty partition runs eagerly; exporting it would divide by zero
        host = cpu_views(args)
        if id(part) not in self.observers:
            model = export_float(part.spec, host)
            self.observers[id(part)] = (part, RangeObserver(model, self.method, self.percentile))
            self.keys[id(part)] = part.calibration_keys(host)
        observer = self.observers[id(part)][1]
        observer.observe([host[i].detach().numpy() for i in part.spec.runtime_positions])
        self.counts[id(part)] = self.counts.get(id(part), 0) + 1


def calibrate(
    compiled_model: Any,
    samples: Iterable[Any],
    method: str = "max",
    percentile: float = 99.99,
) -> Calibration:
    """Run `samples` through a model compiled with backend="bpu" and calibrate every partition.

    Each sample is a tensor or a tuple of positional inputs. The scales go straight into the
    compiled model's partitions (they rebuild on the next call) and are returned as a
    `Calibration` that can be saved and passed as options={'calibration': ...} elsewhere.
    """
    # the same checks (and one-line errors) as options={'calib_method': ..., ...}
    method = parse_option("calib_method", method, "calibrate(method=...)")
    percentile = parse_option("calib_percentile", percentile, "calibrate(percentile=...)")
    session = _Session(method, percentile)
    token = runtime.CALIBRATION.set(session)
    count = 0
    try:
        with torch.no_grad():
            for sample in samples:
                compiled_model(*(sample if isinstance(sample, (tuple, list)) else (sample,)))
                count += 1
    finally:
        runtime.CALIBRATION.reset(token)
    if count == 0:
        raise CalibrationError(
            "calibrate: no samples given; pass an iterable of input tensors/tuples"
        )
    if not session.observers:
        raise CalibrationRunError(
            "calibrate: no BPU partition ran. Pass the object returned by "
            "torch.compile(model, backend='bpu') (not the original model)"
        )
    result = Calibration(method=method)
    for ident, (part, observer) in session.observers.items():
        scales = observer.scales()
        if part.settings.quantize:
            label = f"partition {part.spec.index}"
            part.entry.quant_health = health(observer, scales, part.settings.act_scale, label)
        seen = session.counts[ident]
        source = f"calibrate() on {seen} sample(s) ({method})"
        part.set_scales(scales, source)
        settings = part.settings
        record = stored.Record(scales, tuple(observer.names), source, seen, method)
        cache_dir = settings.cache_dir if settings.cache else None
        stored.STORE.put(session.keys[ident], record, cache_dir)
        result.scales[part.spec.fingerprint] = scales
        result.names[part.spec.fingerprint] = list(observer.names)
        result.families[part.spec.family] = part.spec.fingerprint
    return result

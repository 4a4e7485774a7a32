"""Public calibration API: observe sample inputs, feed the scales into every partition."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from torch_fl.bpu.conversion.calibration import Calibration, RangeObserver, health
from torch_fl.bpu.errors import CalibrationError, CalibrationRunError
from torch_fl.bpu.runtime import partition as runtime
from torch_fl.bpu.settings import parse_option


class _Session:
    def __init__(self, method: str, percentile: float) -> None:
        self.method = method
        self.percentile = percentile
        self.observers: dict[int, tuple[runtime.PartitionRuntime, RangeObserver]] = {}

    def observe(self, part: runtime.PartitionRuntime, args) -> None:
        from torch_fl.bpu.build import export_float

        if id(part) not in self.observers:
            model = export_float(part.spec, args)
            self.observers[id(part)] = (part, RangeObserver(model, self.method, self.percentile))
        observer = self.observers[id(part)][1]
        observer.observe([args[i].detach().numpy() for i in part.spec.runtime_positions])


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
    for part, observer in session.observers.values():
        scales = observer.scales()
        if part.settings.quantize:
            label = f"partition {part.spec.index}"
            part.entry.quant_health = health(observer, scales, part.settings.act_scale, label)
        part.set_scales(scales)
        result.scales[part.spec.fingerprint] = scales
    return result

"""Which activation tensors leave int8: the sensitivity ladder of calibrate(target=...).

HMCT's ladder, on the calibration samples themselves: measure the partition's output cosine
against float with every tensor int8; if it is below the target, measure each tensor's gain when
it alone is int16 (the others int8), promote the tensors with the largest gains, a growing batch
at a time (1, 2, 4, ...), re-measuring after each batch, until the target is met; where even every
sensitive tensor in int16 is not enough, the same ladder moves tensors to float (the op reading
it runs on the CPU). Only the march's precisions are used (`torch_fl/targets.py`
MARCH_PRECISIONS). The result names every tensor it moved and what each step bought.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from torch_fl.bpu.conversion.calibration import RangeObserver, _cosine, _session
from torch_fl.bpu.conversion.qdq import quantize_model
from torch_fl.targets import MARCH_PRECISIONS

MAX_CANDIDATES = 256  # tensors measured one by one (the rest keep int8)


class _Meter:
    """Worst output cosine vs float over the kept calibration samples, per precision map."""

    def __init__(self, observer: RangeObserver, scales: Mapping[str, float], default: float):
        self.observer, self.scales, self.default = observer, dict(scales), default
        self.out_names = [o.name for o in observer.model.graph.output]
        reference = _session(observer.model)
        self.feeds = [
            dict(zip(observer.input_names, inputs, strict=False)) for inputs in observer.kept_inputs
        ]
        self.refs = [reference.run(self.out_names, feed) for feed in self.feeds]
        self.measured = 0

    def cosine(self, precision: Mapping[str, str]) -> float:
        model = quantize_model(self.observer.model, self.scales, self.default, precision)
        session = _session(model)
        self.measured += 1
        worst = 1.0
        for feed, ref in zip(self.feeds, self.refs, strict=True):
            for a, b in zip(ref, session.run(self.out_names, feed), strict=True):
                worst = min(worst, _cosine(np.asarray(a), np.asarray(b)))
        return worst


def _ladder(meter: _Meter, base: dict[str, str], level: str, candidates: list[str],
            start: float, target: float, steps: list[dict]) -> tuple[dict[str, str], float]:  # fmt: skip
    gains = {t: meter.cosine({**base, t: level}) - start for t in candidates}
    order = sorted((t for t in candidates if gains[t] > 0), key=lambda t: -gains[t])
    chosen, current, batch = dict(base), start, 1
    while order and current < target:
        moved, order = order[:batch], order[batch:]
        chosen.update({t: level for t in moved})
        before, current = current, meter.cosine(chosen)
        steps.append({"to": level, "tensors": moved, "cosine_before": round(before, 6),
                      "cosine_after": round(current, 6)})  # fmt: skip
        batch *= 2
    return chosen, current


def promote(
    observer: RangeObserver,
    scales: Mapping[str, float],
    default_scale: float,
    target: float,
    march: str,
) -> tuple[dict[str, str], dict]:
    """(precision map, summary) that reaches `target` output cosine on the kept samples, or gets
    as close as the march's precisions and float allow."""
    meter = _Meter(observer, scales, default_scale)
    outputs = set(meter.out_names)
    candidates = [n for n in observer.names if n not in outputs][:MAX_CANDIDATES]
    start = meter.cosine({})
    steps: list[dict] = []
    precision: dict[str, str] = {}
    current = start
    if current < target and "int16" in MARCH_PRECISIONS.get(march, ("int8",)):
        precision, current = _ladder(meter, {}, "int16", candidates, current, target, steps)
    if current < target:
        precision, current = _ladder(meter, precision, "float", candidates, current, target, steps)
    summary = {
        "target": target,
        "cosine_int8": round(start, 6),
        "cosine": round(current, 6),
        "met": current >= target,
        "int16": sorted(t for t, v in precision.items() if v == "int16"),
        "float": sorted(t for t, v in precision.items() if v == "float"),
        "steps": steps,
        "measured": meter.measured,
        "samples": len(meter.feeds),
    }
    return precision, summary

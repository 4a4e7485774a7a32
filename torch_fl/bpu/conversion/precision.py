"""Which activation tensors leave int8: the sensitivity ladder of calibrate(target=...).

HMCT's ladder, on the calibration samples themselves: measure the partition's output cosine
against float with every tensor int8; if it is below the target, measure each tensor's gain when
it alone is int16 (the others int8), promote the tensors in order of that gain, a growing batch
at a time (1, 2, 4, ...), re-measuring after each batch, until the target is met (the batch that
meets it trimmed to its shortest prefix that still does); where even every tensor in int16 is not
enough, the same ladder moves the inputs of Conv / Gemm / MatMul to dual int16 (their weights
int16 too), then tensors to float (the op reading it runs on the CPU), which reaches any target:
a partition all in float is the float partition. Only the march's precisions are used
(`torch_fl/targets.py` MARCH_PRECISIONS). The result names every tensor it moved and what each step bought.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from torch_fl.bpu.conversion.calibration import RangeObserver, _cosine, _session
from torch_fl.bpu.conversion.qdq import WEIGHT_OPS, quantize_model
from torch_fl.targets import MARCH_PRECISIONS

MAX_CANDIDATES = 256  # tensors measured one by one (the rest keep int8)


class _Meter:
    """Worst output cosine vs float over the kept calibration samples, per precision map."""

    def __init__(self, observer: RangeObserver, scales: Mapping[str, float], default: float):
        self.observer, self.scales, self.default = observer, dict(scales), default
        self.out_names = observer.output_names
        self.feeds = [
            dict(zip(observer.input_names, inputs, strict=False)) for inputs in observer.kept_inputs
        ]
        # the observer's session is the float graph (with its activations as extra outputs)
        self.refs = [observer.session.run(self.out_names, feed) for feed in self.feeds]
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
    """Move `candidates` to `level`, largest single gain first, a doubling batch at a time, until
    `target`; then trim the batch that crossed it to its shortest prefix that still does.

    Every candidate stays in the order, not only those whose move alone helps: where the error
    is spread over many layers, single moves show gains at the noise level (or below it), yet
    moving them together helps; an earlier version that kept only positive gains stopped
    EfficientNet-Lite0 at 0.9957, NOT met."""
    gains = {t: meter.cosine({**base, t: level}) - start for t in candidates}
    order = sorted(candidates, key=lambda t: -gains[t])
    chosen, current, batch = dict(base), start, 1
    while order and current < target:
        moved, order = order[:batch], order[batch:]
        before, current = current, meter.cosine({**chosen, **{t: level for t in moved}})
        if current >= target and len(moved) > 1:
            moved, current = _shortest(meter, chosen, level, moved, target, current)
        chosen.update({t: level for t in moved})
        steps.append({"to": level, "tensors": moved, "cosine_before": round(before, 6),
                      "cosine_after": round(current, 6)})  # fmt: skip
        batch *= 2
    return chosen, current


def _shortest(meter: _Meter, chosen: dict[str, str], level: str, moved: list[str],
              target: float, reached: float) -> tuple[list[str], float]:  # fmt: skip
    """The shortest prefix of `moved` (in gain order) that still reaches `target`, by bisection
    (log2 of the batch more measurements): the doubling batch overshoots by up to half."""
    lo, hi, best = 0, len(moved), reached  # moved[:hi] reaches the target, moved[:lo] may not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        cosine = meter.cosine({**chosen, **{t: level for t in moved[:mid]}})
        if cosine >= target:
            hi, best = mid, cosine
        else:
            lo = mid
    return moved[:hi], best


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
    allowed = MARCH_PRECISIONS.get(march, ("int8",))
    if current < target and "int16" in allowed:
        precision, current = _ladder(meter, {}, "int16", candidates, current, target, steps)
    if current < target and "dual_int16" in allowed:
        # int16 activations alone leave the int8 weights' error: spread over many layers, it
        # caps a deep network (EfficientNet-Lite0: 0.985 with every activation int16)
        readers = {n.input[0] for n in observer.model.graph.node if n.op_type in WEIGHT_OPS}
        duals = [t for t in candidates if t in readers]
        precision, current = _ladder(meter, precision, "dual_int16", duals, current, target, steps)
    if current < target:
        precision, current = _ladder(meter, precision, "float", candidates, current, target, steps)
    summary = {
        "target": target,
        "cosine_int8": round(start, 6),
        "cosine": round(current, 6),
        "met": current >= target,
        "int16": sorted(t for t, v in precision.items() if v == "int16"),
        "dual_int16": sorted(t for t, v in precision.items() if v == "dual_int16"),
        "float": sorted(t for t, v in precision.items() if v == "float"),
        "steps": steps,
        "measured": meter.measured,
        "samples": len(meter.feeds),
    }
    return precision, summary

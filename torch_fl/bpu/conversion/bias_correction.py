"""Bias correction: remove the mean error int8 rounding adds to each output channel.

Rounding a layer's weights (and its input) to int8 shifts the mean of some output channels: the
error E[W_q x_q] - E[W x] is not zero where a channel's rounding errors do not cancel (Nagel et
al., "Data-Free Quantization Through Weight Equalization and Bias Correction", 2019, the
empirical form). `corrections` measures that mean per output channel of every Conv / Gemm with
a bias, the layer alone (its input quantized as the partition quantizes it, fed the float
network's values; weights int8) on the kept calibration samples, and keeps a layer's
correction only where it raises the layer's own output cosine on those samples. The result is a
per-bias delta: the artifact quantizes `bias + delta` (`qdq.add_to_biases`; the live-weights graph adds the
delta to the live bias), saved with the calibration.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from torch_fl.bpu.conversion.calibration import RangeObserver, _cosine, _session
from torch_fl.bpu.conversion.layer_check import alone_model, with_outputs
from torch_fl.bpu.conversion.layer_select import weight_ops


def _biased_layers(model: onnx.ModelProto, precision: Mapping[str, str]) -> list[onnx.NodeProto]:
    """Conv / Gemm nodes with a constant bias whose input is quantized (not kept in float)."""
    inits = {i.name for i in model.graph.initializer}
    return [
        n for n in weight_ops(model)
        if n.op_type in ("Conv", "Gemm") and len(n.input) > 2 and n.input[2] in inits
        and precision.get(n.input[0]) != "float"
    ]  # fmt: skip


def _channel_mean(values: list[np.ndarray]) -> np.ndarray:
    """Mean over samples, batch and spatial axes: one number per channel (axis 1)."""
    return np.mean([v.mean(axis=tuple(i for i in range(v.ndim) if i != 1)) for v in values], 0)


def corrections(
    observer: RangeObserver,
    scales: Mapping[str, float],
    default: float,
    precision: Mapping[str, str],
) -> tuple[dict[str, np.ndarray], dict]:
    """({bias initializer: float32 delta per output channel}, summary {"layers", "corrected",
    "cosine_before", "cosine_after" (the worst corrected layer's, before and after)})."""
    model = observer.model
    layers = _biased_layers(model, precision)
    summary = {"layers": len(layers), "corrected": 0}
    if not layers or not observer.kept_inputs:
        return {}, summary
    inits = {i.name: i for i in model.graph.initializer}
    feeds = [dict(zip(observer.input_names, i, strict=False)) for i in observer.kept_inputs]
    names = [n.output[0] for n in layers]
    names += sorted({n.input[0] for n in layers} - set(observer.input_names) - set(names))
    reference = _session(with_outputs(model, names))
    values = [dict(zip(names, reference.run(names, f), strict=True)) | f for f in feeds]
    deltas: dict[str, np.ndarray] = {}
    worst = (1.0, 1.0)
    for node in layers:
        act, out = node.input[0], node.output[0]
        refs = [v[out] for v in values]
        shapes = (list(values[0][act].shape), list(refs[0].shape))
        prec = precision.get(act, "int8")
        session = _session(alone_model(model, node, inits, scales, default, prec, shapes))
        got = [session.run([out], {act: v[act]})[0] for v in values]
        if got[0].ndim < 2 or got[0].shape[1] != numpy_helper.to_array(inits[node.input[2]]).size:
            continue
        error = _channel_mean([g - r for g, r in zip(got, refs, strict=True)])
        shift = error.reshape((1, -1) + (1,) * (got[0].ndim - 2)).astype(np.float32)
        before = min(_cosine(g, r) for g, r in zip(got, refs, strict=True))
        after = min(_cosine(g - shift, r) for g, r in zip(got, refs, strict=True))
        if after > before:
            deltas[node.input[2]] = (-error).astype(np.float32)
            worst = min(worst, (before, after))
    summary["corrected"] = len(deltas)
    if deltas:
        summary["cosine_before"], summary["cosine_after"] = (round(c, 6) for c in worst)
    return deltas, summary

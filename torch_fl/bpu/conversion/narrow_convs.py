"""Narrow integer convolutions (an image stem) as float convolutions over integer values, exact.

ONNX Runtime runs a fused DQ -> Conv -> Q as QLinearConv: an int8 GEMM of im2col rows against
the weights, int32 accumulation, then one requantization, `round(float(acc) * m) + zp_y` with
`m = x_scale * w_scale[c] / y_scale` in float32. Where the GEMM is narrow, few input channels
(K = C_in x kh x kw at most `MAX_K`) and few output channels (at most `MAX_OUT`), most of each
vector lane is padding and the float NCHWc convolution ORT runs for float graphs is faster:
MobileNetV3's 3x3 stem from 3 to 16 channels took 213 us of its 1.15 ms session at batch 1
(ORT's profiler, 2-vCPU EPYC with AVX512-VNNI), and alone, as int8 / float, 0.243 / 0.133 ms at
batch 1 on 1 thread, 0.145 / 0.108 on 2, 1.91 / 1.20 at batch 8. Wider ones lose: 3 to 24 or 32
channels won on 1 thread and lost on 2 (0.165 / 0.195 ms), 3 to 64 lost (7x7: 0.783 / 1.088 ms,
ResNet-18's whole session 4.5 against 8.6 ms), hence the bounds.

The rewrite keeps the integer arithmetic: `DequantizeLinear(q_x, 1, zp_x)` gives `q_x - zp_x`
as floats, the weights and bias are stored as their integers (`q_w - zp_w`, `q_b`) in float, so
every product and partial sum of the float convolution is an integer; where each output's sum
of |weights| x the largest |q_x - zp_x|, plus |bias|, stays below 2^24 every one of them is exact
in float32, in any order, and the accumulator equals QLinearConv's int32 one, converted. Then
`Mul` by `m` (the same float32 product) and `QuantizeLinear(., 1, zp_y)` round it as ORT's
requantization does (to nearest even, saturated). ONNX Runtime's `ConvMulFusion` would fold that
`Mul` into the weights, so the sim's sessions run without it (runtime/executors.UNFUSED). The
sim's tests hold the two graphs equal bit for bit (tests/compile/test_narrow_convs.py).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from torch_fl.bpu.conversion.export import attribute, splice

__all__ = ["MAX_K", "MAX_OUT", "rewrite_narrow_convs"]

MAX_K = 32
"""Input channels x kernel height x kernel width of a rewritten conv, at most (3x3 over 3)."""
MAX_OUT = 16
"""Output channels of a rewritten conv, at most (see the module's measurements)."""
EXACT_BELOW = 2**24
"""Integers below this are exact in float32, and so is every sum of them that stays below it."""


class _Graph:
    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.inits = {i.name: i for i in model.graph.initializer}
        self.producer = {o: n for n in model.graph.node for o in n.output}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for node in model.graph.node:
            for name in node.input:
                self.readers.setdefault(name, []).append(node)
        self.outputs = {o.name for o in model.graph.output}

    def const(self, name: str) -> np.ndarray | None:
        init = self.inits.get(name)
        return None if init is None else numpy_helper.to_array(init)

    def dq_of(self, name: str) -> onnx.NodeProto | None:
        node = self.producer.get(name)
        return node if node is not None and node.op_type == "DequantizeLinear" else None


def _dq_parts(graph: _Graph, dq: onnx.NodeProto) -> tuple | None:
    """(quantized tensor name, scale, zero point) of a DequantizeLinear with constant scale and
    zero point (zero point 0 where absent)."""
    scale = graph.const(dq.input[1])
    zero = graph.const(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else np.zeros((), np.int32)
    if scale is None or zero is None:
        return None
    return dq.input[0], scale.astype(np.float32), zero


def _plan(graph: _Graph, conv: onnx.NodeProto) -> dict | None:
    """What a qualifying `conv` (DQ x, DQ w, DQ b -> Conv -> one Q) becomes, or None."""
    attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
    if attrs.get("group", 1) != 1 or len(conv.input) != 3:
        return None
    dqs = [graph.dq_of(name) for name in conv.input]
    readers = graph.readers.get(conv.output[0], [])
    if any(d is None for d in dqs) or conv.output[0] in graph.outputs or len(readers) != 1:
        return None
    quant = readers[0]
    if quant.op_type != "QuantizeLinear" or len(quant.input) < 3:
        return None
    parts = [_dq_parts(graph, d) for d in dqs]
    y_scale, y_zero = graph.const(quant.input[1]), graph.const(quant.input[2])
    if any(p is None for p in parts) or y_scale is None or y_zero is None:
        return None
    (x_name, x_scale, x_zero), (w_name, w_scale, w_zero), (b_name, _, b_zero) = parts
    weight, bias = graph.const(w_name), graph.const(b_name)
    if weight is None or bias is None or weight.ndim != 4 or x_scale.size != 1:
        return None
    if x_zero.dtype not in (np.uint8, np.int8) or weight.dtype not in (np.uint8, np.int8):
        return None
    if bias.dtype != np.int32 or np.any(b_zero != 0) or y_scale.size != 1:
        return None
    if x_zero.size != 1 or y_zero.size != 1 or w_scale.size not in (1, weight.shape[0]):
        return None  # per-tensor activations, weights per tensor or per output channel
    if w_zero.size not in (1, weight.shape[0]) or bias.shape != (weight.shape[0],):
        return None
    if w_scale.size > 1 and attribute(dqs[1], "axis", 1) not in (0, -4):
        return None  # per-channel along another axis: not a layout ORT fuses into QLinearConv
    out_channels, k = weight.shape[0], int(np.prod(weight.shape[1:]))
    if weight.shape[2] * weight.shape[3] == 1 or k > MAX_K or out_channels > MAX_OUT:
        return None  # a 1x1 conv is a plain GEMM, which the int8 kernels run well
    w_int = weight.astype(np.int64) - w_zero.astype(np.int64).reshape(-1, 1, 1, 1)
    info, zero = np.iinfo(x_zero.dtype), int(x_zero.reshape(-1)[0])
    x_reach = max(zero - info.min, info.max - zero)  # largest |q_x - zp_x|
    bound = np.abs(w_int).reshape(out_channels, -1).sum(1) * x_reach + np.abs(bias.astype(np.int64))
    if bound.max() >= EXACT_BELOW:
        return None
    # ORT's requantization scale, the same float32 operations in the same order
    w_scale = np.broadcast_to(w_scale.reshape(-1), (out_channels,))
    requant = (np.float32(x_scale.reshape(())) * w_scale) / np.float32(y_scale.reshape(()))
    return {
        "attrs": attrs,
        "x": (x_name, dqs[0].input[2]),
        "weight": w_int.astype(np.float32),
        "bias": bias.astype(np.float32),
        "requant": requant.astype(np.float32).reshape(1, -1, 1, 1),
        "quant": quant,
        "dqs": dqs,
    }


def rewrite_narrow_convs(model: onnx.ModelProto) -> int:
    """Rewrite, in place, each qualifying integer conv of the Q/DQ `model` (see the module
    docstring) as the exact float form; returns how many. Run it on the integer form
    (conversion/integer_form.py), before ONNX Runtime's optimizer."""
    graph = _Graph(model)
    plans = [
        (n, p) for n in model.graph.node if n.op_type == "Conv" for p in [_plan(graph, n)] if p
    ]
    if not plans:
        return 0
    one = "narrow_conv::one"
    model.graph.initializer.append(numpy_helper.from_array(np.array(1.0, np.float32), one))
    replaced: dict[int, list[onnx.NodeProto]] = {}
    dropped: set[int] = set()
    for conv, plan in plans:
        base = f"narrow_conv::{conv.output[0]}"
        quant = plan["quant"]
        model.graph.initializer.extend([
            numpy_helper.from_array(plan["weight"], f"{base}/w"),
            numpy_helper.from_array(plan["bias"], f"{base}/b"),
            numpy_helper.from_array(plan["requant"], f"{base}/m"),
        ])  # fmt: skip
        x_name, x_zero = plan["x"]
        replaced[id(conv)] = [
            helper.make_node("DequantizeLinear", [x_name, one, x_zero], [f"{base}/x"]),
            helper.make_node(
                "Conv", [f"{base}/x", f"{base}/w", f"{base}/b"], [f"{base}/acc"], **plan["attrs"]
            ),
            helper.make_node("Mul", [f"{base}/acc", f"{base}/m"], [f"{base}/scaled"]),
            helper.make_node(
                "QuantizeLinear", [f"{base}/scaled", one, quant.input[2]], list(quant.output)
            ),  # fmt: skip
        ]
        dropped.add(id(quant))
    old_dqs = {d.output[0] for _, plan in plans for d in plan["dqs"]}
    splice(model, replaced, dropped)
    _drop_unread(model, old_dqs)
    return len(plans)


def _drop_unread(model: onnx.ModelProto, candidates: set[str]) -> None:
    """Remove the nodes producing `candidates` (the replaced convs' DequantizeLinear outputs)
    where nothing reads them any more, and then the initializers only they read."""

    def read_names() -> set[str]:
        names = {o.name for o in model.graph.output}
        for node in model.graph.node:
            names.update(node.input)
            for attr in node.attribute:  # a subgraph may read an outer name: keep those too
                if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                    return set()
        return names

    read = read_names()
    if not read:
        return
    kept = [
        n for n in model.graph.node
        if not (set(n.output) <= candidates and not any(o in read for o in n.output))
    ]  # fmt: skip
    del model.graph.node[:]
    model.graph.node.extend(kept)
    read = read_names()
    unread = [i for i in model.graph.initializer if i.name not in read]
    for init in unread:
        model.graph.initializer.remove(init)

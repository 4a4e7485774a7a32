"""Integer convolutions over few input channels (an image stem) of ONNX Runtime's optimized sim
graph as the extension's own op, on AVX512-VNNI or AVX2.

ONNX Runtime runs an int8 conv as im2col rows against packed weights; over 3 input channels
most of each row is padding. MobileNetV3's 3x3 stem from 3 to 16 channels took 226 us (batch 1,
1 thread, ORT's profiler, AVX512-VNNI EPYC), and its exact float form
(conversion/narrow_convs.py) with the conversions around it 137 us for five of its six nodes (the
dequantize not counted). This pass replaces
each channels-last QLinearConv with one group and at most `MAX_INPUTS` input channels and
`MAX_OUTPUTS` outputs with `torch_fl.bpu.NarrowConvU8` / `I8` (csrc/runtime/ort_narrow.cpp):
an input pixel's channels as one 32-bit word, multiplied with 16 output channels' weights by
one `vpdpbusd` a kernel tap, QLinearConv's own int32 accumulator, then ORT's requantization.
Where the conv reads the NHWC transpose of an NCHW tensor (the quantized model input, as ORT
lays out a stem), the op reads the NCHW tensor itself and the transpose goes. The result is
QLinearConv's byte for byte (tests/compile/test_narrow_op.py).

Only where the op has a vector form (`torch_fl._C._narrow_kernel()`: "vnni", or "avx2" with
16-bit `vpmaddwd` products, up to `MAX_OUTPUTS_BY_FORM` outputs); elsewhere the float form of
conversion/narrow_convs.py stays the sim's (runtime/executors.py decides).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from torch_fl.bpu.conversion.export import attribute, links, splice
from torch_fl.bpu.conversion.lookups import DOMAIN, import_domain
from torch_fl.bpu.conversion.qlinear_conv import conv_parts, drop_unread, integer_conv_weights

__all__ = [
    "MAX_INPUTS",
    "MAX_OUTPUTS",
    "MAX_OUTPUTS_BY_FORM",
    "OPS",
    "candidates",
    "rewrite_narrow",
]

MAX_INPUTS = 4
"""Input channels of a rewritten conv, at most: one 32-bit word of bytes per pixel."""
MAX_OUTPUTS = 64
"""Output channels of a rewritten conv, at most (four blocks of 16 in the op's registers)."""
MAX_OUTPUTS_BY_FORM = {"vnni": MAX_OUTPUTS, "avx2": 32}
"""Output channels of a rewritten conv, at most, per form of the op (`_C._narrow_kernel()`): past
32 outputs the AVX2 form lost ResNet's 7x7 stem from 3 to 64 channels to ORT's own kernel (over
words, and over packed rows), and 3x3 stems to 48 and 64 over packed rows (docs/compile.md,
*Narrow convolutions on the extension's op*), while it wins the stems of 8 to 32."""
OPS = {TensorProto.UINT8: "NarrowConvU8", TensorProto.INT8: "NarrowConvI8"}
_NCHW_TO_NHWC = [0, 2, 3, 1]


def candidates(model: onnx.ModelProto) -> int:
    """How many convs of the integer graph `model` (before ORT's optimizer) may qualify: one
    group and at most `MAX_INPUTS` input channels by their (possibly dequantized) weights;
    `rewrite_narrow` decides each on ORT's optimized graph."""
    count = 0
    for node, dims in integer_conv_weights(model):
        group = attribute(node, "group", 1)
        count += dims is not None and len(dims) == 4 and group == 1 and dims[1] <= MAX_INPUTS
    return count


def rewrite_narrow(model: onnx.ModelProto, form: int = 0, max_outputs: int = MAX_OUTPUTS) -> int:
    """Replace, in place, each qualifying channels-last QLinearConv of ORT's optimized `model`
    (at most `max_outputs` output channels) with a NarrowConv op; returns how many. `form` 1
    asks the op for its plain loop (tests compare the forms)."""
    inits = {i.name: i for i in model.graph.initializer}
    producer, reads, outputs = links(model)
    added: list[onnx.TensorProto] = []
    replaced: dict[int, list[onnx.NodeProto]] = {}
    dropped: set[int] = set()
    for node in model.graph.node:
        plan = _plan(node, inits, max_outputs)
        if plan is None:
            continue
        source, layout = node.input[0], 0
        transpose = producer.get(source)
        if (
            transpose is not None
            and transpose.op_type == "Transpose"
            and list(attribute(transpose, "perm", [])) == _NCHW_TO_NHWC
            and reads.get(source) == 1
            and source not in outputs
        ):
            source, layout = transpose.input[0], 1
            dropped.add(id(transpose))
        prefix = f"narrow::{node.name or node.output[0]}"
        names = [f"{prefix}/{part}" for part in ("weights", "bias", "scale", "geometry")]
        geometry = np.array([*plan["geometry"], layout, form], np.int64)
        arrays = (plan["weights"], plan["bias"], plan["scale"], geometry)
        added += [numpy_helper.from_array(a, n) for a, n in zip(arrays, names, strict=True)]
        op = helper.make_node(
            OPS[plan["type"]], [source, *names], [node.output[0]], name=prefix, domain=DOMAIN
        )
        replaced[id(node)] = [op]
    if replaced:
        splice(model, replaced, dropped)
        model.graph.initializer.extend(added)
        drop_unread(model)
        import_domain(model)
    return len(replaced)


def _plan(node: onnx.NodeProto, inits: dict, max_outputs: int) -> dict | None:
    """The NarrowConv inputs for `node`, or None where it is not a channels-last 2-D
    QLinearConv with one group, few channels, weights within int8 and constant parameters."""
    conv = conv_parts(node, inits)
    if conv is None or conv.group != 1:
        return None
    outputs, inputs, kh, kw = conv.taps.shape
    if inputs > MAX_INPUTS or outputs > min(max_outputs, MAX_OUTPUTS):
        return None
    if conv.taps.min() < -128 or conv.taps.max() > 127:  # vpdpbusd's signed byte operand
        return None
    padded = (outputs + 15) // 16 * 16
    # [KH * KW, CO16, 4]: per tap, each output channel's 4 input-channel weights in a word
    weights = np.zeros((kh * kw, padded, MAX_INPUTS), np.int8)
    weights[:, :outputs, :inputs] = conv.taps.transpose(2, 3, 0, 1).reshape(kh * kw, outputs, -1)
    return {
        "type": conv.x_type,
        "weights": weights,
        "bias": conv.bias.astype(np.int32),
        "scale": conv.scale,
        "geometry": [*conv.geometry(), outputs],
    }

"""Shapes that ONNX Runtime cannot infer in the sim's session graph, declared for it.

ONNX Runtime infers each tensor's shape when it opens a session, op by op from the graph's
inputs, but not past an op it does not know: the extension's ops (conversion/session_graph.py)
give it none of their own. With the image stem on `NarrowConvU8` (conversion/narrow_op.py), no
tensor after it had a shape there.

The shapes matter to ORT's allocation planner. A byte lookup (conversion/lookups.py) may write
its result over its input where this op is that input's last reader (`in_place_op`,
csrc/runtime/ort_kernel.h), but the planner grants it only where it knows both shapes to be
equal, and the lookup op gives its output its input's shape only where ORT knows that one. In
place, the lookup writes into the lines it has just read, already in the cache, instead of a
buffer it must first fetch: MobileNetV2's 35 ReLU6 clamps after ORT's convs (by hand, batch 1,
1 thread, 100 blocks of ten runs in turns, medians of the paired ratios) took its session to
0.986 of the same graph without in place, and to 0.966 together with the clamp form of
csrc/runtime/ort_lookup.cpp (`clamp_bytes`), which alone gave 0.995.

This pass computes what it can here, from the graph's inputs (ORT's optimized graph records
no shapes of its own for the tensors between) through quantize, dequantize, transpose, byte
lookup and channels-last QLinearConv nodes to the NarrowConv ops they feed
(the stem: each output channels-last, from the op's geometry), the DepthwiseConv and
GroupedConv ops (channels-last, from the geometry and the bias's length) and the PairGemm and
Gemv ops (x's leading dimensions, then the correction's length), and declares those shapes; ORT infers
the rest through its own ops. A shape it cannot compute is not declared (a wrong one would make
ORT reuse a buffer of the wrong size: it checks and fails the run, or falls back to
allocating). A byte lookup runs in place over its input's buffer only where ORT knows that
input's shape, so a lookup after one of the extension's ops needs the op's output declared here
(tests/compile/test_session_shapes.py).
"""

from __future__ import annotations

import onnx
from onnx import helper, numpy_helper

from torch_fl.bpu.conversion.lookups import DOMAIN

__all__ = ["declare_shapes"]

_SAME_SHAPE = frozenset({"QuantizeLinear", "DequantizeLinear"})
_NARROW = {"NarrowConvU8": onnx.TensorProto.UINT8, "NarrowConvI8": onnx.TensorProto.INT8}
_LOOKUPS = frozenset({"LookupU8", "LookupI8"})
"""Byte lookups (table, x): x's shape, which ORT gives them too once it knows x's."""
_U8, _I8, _F32 = onnx.TensorProto.UINT8, onnx.TensorProto.INT8, onnx.TensorProto.FLOAT
_WINDOWED = {"DepthwiseConvU8": _U8, "DepthwiseConvI8": _I8, "GroupedConvU8": _U8,
             "GroupedConvI8": _I8}  # fmt: skip
"""Channels-last conv ops (csrc/runtime/ort_depthwise.cpp): x, weights, bias, scale, geometry."""
_GEMMS = {"PairGemmU8": _U8, "PairGemmI8": _I8, "PairGemmU8F": _F32, "PairGemmI8F": _F32,
               "GemvU8": _U8, "GemvI8": _I8, "GemvU8F": _F32, "GemvI8F": _F32}  # fmt: skip
"""csrc/runtime/ort_pair_gemm.cpp and ort_gemv.cpp: x [..., K], weights, corr [N], scale,
geometry -> [..., N]."""


def _known(info: onnx.ValueInfoProto) -> list | None:
    """`info`'s shape as sizes and symbol names, or None where a dimension has neither."""
    tensor = info.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    dims: list = []
    for d in tensor.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(d.dim_value)
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            return None
    return dims


def _narrow_output(x: list, geometry) -> list | None:
    """The NarrowConv op's output shape [N, OH, OW, CO] for x of shape `x` (csrc/runtime/
    ort_narrow.cpp: geometry KH, KW, strides, pads top, left, bottom, right, dilations, zero
    points, CO, layout; x channels-first where layout is 1); None where the spatial sizes are
    symbolic or out of range."""
    if len(x) != 4 or len(geometry) < 14:
        return None
    channels_last = [x[0], x[2], x[3], x[1]] if int(geometry[13]) == 1 else x
    return _windowed_output(channels_last, geometry[:10], int(geometry[12]))


def _windowed_output(x: list, geometry, channels: int) -> list | None:
    """A DepthwiseConv / GroupedConv op's output [N, OH, OW, channels] for a channels-last x
    (geometry KH, KW, strides, pads top, left, bottom, right, dilations first); None where the
    spatial sizes are symbolic or out of range."""
    if len(x) != 4 or len(geometry) < 10 or channels < 1:
        return None
    kh, kw, sh, sw, pt, pl, pb, pr, dh, dw = (int(v) for v in geometry[:10])
    h, w = x[1], x[2]
    if not (isinstance(h, int) and isinstance(w, int)) or min(sh, sw, dh, dw) < 1:
        return None
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    return [x[0], oh, ow, channels] if oh > 0 and ow > 0 else None


def _length(init: onnx.TensorProto | None) -> int:
    """How many values a 1-D initializer holds (0: not one)."""
    return int(init.dims[0]) if init is not None and len(init.dims) == 1 else 0


def _qlinear_conv_output(node: onnx.NodeProto, x: list, inits: dict) -> list | None:
    """A channels-last com.microsoft QLinearConv's output [N, OH, OW, CO] (CO: its weights'
    first dimension), from its attributes; None where any of them is missing or symbolic."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    weights = inits.get(node.input[3]) if len(node.input) > 3 else None
    if attrs.get("channels_last") != 1 or weights is None or len(weights.dims) != 4:
        return None
    kernel = list(attrs.get("kernel_shape") or weights.dims[2:])
    strides = list(attrs.get("strides") or [1, 1])
    dilations = list(attrs.get("dilations") or [1, 1])
    pads = list(attrs.get("pads") or [0, 0, 0, 0])
    if len(kernel) != 2 or len(strides) != 2 or len(dilations) != 2 or len(pads) != 4:
        return None
    if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    geometry = [*kernel, *strides, pads[0], pads[1], pads[2], pads[3], *dilations]
    return _windowed_output(x, geometry, int(weights.dims[0]))


def declare_shapes(model: onnx.ModelProto) -> int:
    """Declare, in place, the shape of each output of the extension's ops in `model` (a
    rewritten session graph) that this pass can compute (above); returns how many."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    declared = {v.name for v in graph.value_info} | {o.name for o in graph.output}
    shapes: dict[str, list] = {}
    types: dict[str, int] = {}
    for info in (*graph.input, *graph.value_info):
        dims = _known(info)
        if dims is not None:
            shapes[info.name] = dims
    added = 0
    for node in graph.node:  # topological: each input's shape, where known, comes first
        if node.domain == DOMAIN and node.op_type in _LOOKUPS and len(node.input) == 2:
            x = shapes.get(node.input[1])  # (table, x) -> x's shape
            if x is not None:
                shapes[node.output[0]] = x
            continue
        x = shapes.get(node.input[0]) if node.input else None
        if x is None:
            continue
        out: list | None = None
        if node.domain == "com.microsoft" and node.op_type == "QLinearConv":
            out = _qlinear_conv_output(node, x, inits)
        elif node.domain in ("", "ai.onnx") and node.op_type in _SAME_SHAPE:
            out = x
        elif node.domain in ("", "ai.onnx") and node.op_type == "Transpose":
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            if perm is not None and sorted(perm) == list(range(len(x))):
                out = [x[p] for p in perm]
        elif node.domain == DOMAIN and node.op_type in _NARROW and len(node.input) == 5:
            geometry = inits.get(node.input[4])
            if geometry is not None:
                out = _narrow_output(x, numpy_helper.to_array(geometry).tolist())
            types[node.output[0]] = _NARROW[node.op_type]
        elif node.domain == DOMAIN and node.op_type in _WINDOWED and len(node.input) == 5:
            geometry = inits.get(node.input[4])
            channels = _length(inits.get(node.input[2]))
            if geometry is not None:
                out = _windowed_output(x, numpy_helper.to_array(geometry).tolist(), channels)
            types[node.output[0]] = _WINDOWED[node.op_type]
        elif node.domain == DOMAIN and node.op_type in _GEMMS and len(node.input) == 5:
            columns = _length(inits.get(node.input[2]))
            out = [*x[:-1], columns] if columns > 0 and len(x) >= 2 else None
            types[node.output[0]] = _GEMMS[node.op_type]
        if out is None:
            continue
        shapes[node.output[0]] = out
        name = node.output[0]
        if name in types and name not in declared:
            graph.value_info.append(helper.make_tensor_value_info(name, types[name], out))
            declared.add(name)
            added += 1
    return added

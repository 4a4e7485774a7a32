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

This pass computes what it can here, from the graph's inputs through quantize, dequantize and
transpose nodes to the NarrowConv ops they feed (the stem: each output channels-last, from the op's
geometry), and declares those shapes; ORT infers the rest through its own ops. A shape it
cannot compute is not declared (a wrong one would make ORT reuse a buffer of the wrong size:
it checks and fails the run, or falls back to allocating).
"""

from __future__ import annotations

import onnx
from onnx import helper, numpy_helper

from torch_fl.bpu.conversion.lookups import DOMAIN

__all__ = ["declare_shapes"]

_SAME_SHAPE = frozenset({"QuantizeLinear", "DequantizeLinear"})
_NARROW = {"NarrowConvU8": onnx.TensorProto.UINT8, "NarrowConvI8": onnx.TensorProto.INT8}


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
    points, CO, layout); None where the spatial sizes are symbolic or out of range."""
    if len(x) != 4 or len(geometry) < 14:
        return None
    kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, _, _, co, layout = (int(v) for v in geometry[:14])
    h, w = (x[2], x[3]) if layout == 1 else (x[1], x[2])
    if not (isinstance(h, int) and isinstance(w, int)) or min(sh, sw, dh, dw, co) < 1:
        return None
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    return [x[0], oh, ow, co] if oh > 0 and ow > 0 else None


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
        x = shapes.get(node.input[0]) if node.input else None
        if x is None:
            continue
        out: list | None = None
        if node.domain in ("", "ai.onnx") and node.op_type in _SAME_SHAPE:
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
        if out is None:
            continue
        shapes[node.output[0]] = out
        name = node.output[0]
        if name in types and name not in declared:
            graph.value_info.append(helper.make_tensor_value_info(name, types[name], out))
            declared.add(name)
            added += 1
    return added

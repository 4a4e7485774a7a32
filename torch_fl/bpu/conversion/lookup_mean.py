"""A float table lookup and the ReduceMean over it, in ONNX Runtime's optimized sim graph, as one
op of the extension's.

A squeeze-excitation block means its activation over the spatial axes. Once the activation is a
`LookupF32` (conversion/lookups.py), ORT still writes the float tensor and its ReduceMean reads it
back: MobileNetV3-Small's integer session at batch 1 took 0.73 and 0.75 ms with its 8 such pairs
and 0.60 with them gone (by hand, 1 thread, two runs, medians of nine blocks of 100).
`LookupMeanF32` (csrc/runtime/ort_mean.cpp) reads the bytes once and adds the looked-up floats in
the order ORT's ReduceMean adds its inputs where, once the axes of size 1 are dropped, the
reduced axes come first: row after row from the first, then a division by the row count. The
result is the pair's float for float (tests/compile/test_lookup_mean.py).

With a batch of more than one, or axes of size above 1 before the reduced ones (a mean over the
last axes of [N, C, H, W]), ORT adds in another order, which this op does not reproduce, so a
pair is rewritten only where ONNX shape inference of the integer graph gives the ReduceMean's
input (moved channels-last where ORT moved the node's axes so) the row-after-row form; the op
itself refuses any other reduction at run time, by name.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from torch_fl.bpu.conversion.export import attribute, links, splice
from torch_fl.bpu.conversion.inferred_shapes import InferredShapes, inferred_shapes
from torch_fl.bpu.conversion.lookups import DOMAIN

__all__ = ["OP", "fuse_means", "pairs", "reduce_shapes"]

OP = "LookupMeanF32"


def pairs(model: onnx.ModelProto) -> int:
    """How many ReduceMean nodes of `model` read a LookupF32 (candidates for `fuse_means`)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    return sum(
        node.op_type == "ReduceMean"
        and getattr(producer.get(node.input[0]), "op_type", None) == "LookupF32"
        for node in model.graph.node
    )


def reduce_shapes(
    model: onnx.ModelProto | InferredShapes,
) -> dict[str, tuple[list[int], list[int]]]:
    """(input shape, reduced axes) of each named ReduceMean of the integer graph `model` (before
    ORT's optimizer, which keeps the node's name but may permute its axes), where shape inference
    knows the shape in full."""
    shapes = inferred_shapes(model)
    inferred, dims = shapes.graph, shapes.dims
    if inferred is None:
        return {}
    inits = {i.name: i for i in inferred.initializer}
    found = {}
    for node in inferred.node:
        if node.op_type == "ReduceMean" and node.name and node.input[0] in dims:
            axes = _axes(node, inits, len(dims[node.input[0]]))
            if axes is not None:
                found[node.name] = (dims[node.input[0]], axes)
    return found


def fuse_means(
    model: onnx.ModelProto, shapes: dict[str, tuple[list[int], list[int]]], form: int = 0
) -> int:
    """Replace, in place, each LookupF32 -> ReduceMean pair of ORT's optimized `model` whose
    ReduceMean (by name; its input shape and axes in `shapes`, `reduce_shapes` of the graph ORT
    optimized) reduces rows first (`_rows_first`) with one LookupMeanF32; returns how many.
    `form` 1 asks the op for its plain loop (tests compare the forms)."""
    producer, reads, outputs = links(model)
    inits = {i.name: i for i in model.graph.initializer}
    replaced: dict[int, list[onnx.NodeProto]] = {}
    dropped: set[int] = set()
    added: list[onnx.TensorProto] = []
    for node in model.graph.node:
        lookup = producer.get(node.input[0]) if node.op_type == "ReduceMean" else None
        if lookup is None or lookup.op_type != "LookupF32" or lookup.domain != DOMAIN:
            continue
        if reads.get(node.input[0]) != 1 or node.input[0] in outputs:
            continue
        original = shapes.get(node.name)
        axes = _axes(node, inits, len(original[0])) if original is not None else None
        if axes is None or not _rows_first(_optimized_shape(*original, axes), axes):
            continue
        keepdims = attribute(node, "keepdims", 1)
        prefix = f"lookup_mean::{node.name}"
        added += [
            numpy_helper.from_array(np.array(axes, np.int64), f"{prefix}/axes"),
            numpy_helper.from_array(np.array([keepdims, form], np.int64), f"{prefix}/options"),
        ]
        inputs = [lookup.input[0], lookup.input[1], f"{prefix}/axes", f"{prefix}/options"]
        op = helper.make_node(OP, inputs, [node.output[0]], name=prefix, domain=DOMAIN)
        replaced[id(node)] = [op]
        dropped.add(id(lookup))
    if replaced:
        splice(model, replaced, dropped)
        model.graph.initializer.extend(added)
    return len(replaced)


def _axes(node: onnx.NodeProto, inits: dict, rank: int) -> list[int] | None:
    """ReduceMean `node`'s axes, from 0 and ascending (an attribute, or a constant input from
    opset 18); None where it has none (a reduction over every axis) or they fall outside
    `rank`."""
    axes = attribute(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1] in inits:
        axes = numpy_helper.to_array(inits[node.input[1]]).reshape(-1).tolist()
    if not axes:
        return None
    axes = sorted(int(a) + rank if a < 0 else int(a) for a in axes)
    return axes if 0 <= axes[0] and axes[-1] < rank else None


_NCHW_TO_NHWC = (0, 2, 3, 1)


def _optimized_shape(shape: list[int], axes: list[int], new_axes: list[int]) -> list[int] | None:
    """The input shape of the optimized ReduceMean: the original `shape` where its axes are the
    original `axes`; where ORT made the tensor channels-last (4-D, axes moved as that moves
    them), the shape moved so; else None (unknown)."""
    if new_axes == axes:
        return shape
    if len(shape) == 4 and sorted(_NCHW_TO_NHWC.index(a) for a in axes) == new_axes:
        return [shape[p] for p in _NCHW_TO_NHWC]
    return None


def _rows_first(shape: list[int] | None, axes: list[int]) -> bool:
    """Whether ReduceMean over `axes` of `shape` is ORT's row-after-row form: contiguous axes,
    every axis before them of size 1, at least two outputs (csrc/runtime/ort_mean.cpp checks
    the same at run time)."""
    if shape is None or axes != list(range(axes[0], axes[-1] + 1)):
        return False
    return all(s == 1 for s in shape[: axes[0]]) and int(np.prod(shape[axes[-1] + 1 :])) >= 2

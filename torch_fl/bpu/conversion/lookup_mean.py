"""A float table lookup and the ReduceMean over it, in ONNX Runtime's optimized sim graph, as one
op of the extension's.

A squeeze-excitation block means its activation over the spatial axes. Once the activation is a
`LookupF32` (conversion/lookups.py), ORT still writes the float tensor and its ReduceMean reads it
back: MobileNetV3-Small's integer session at batch 1 took 0.73 and 0.75 ms with its 8 such pairs
and 0.60 with them gone (by hand, 1 thread, two runs, medians of nine blocks of 100).
`LookupMeanF32` (csrc/runtime/ort_mean.cpp) reads the bytes once and adds the looked-up floats in
the order ORT's ReduceMean adds its inputs, so the result is the pair's float for float
(tests/compile/test_lookup_mean.py). ORT has two orders, by the shape once the axes of size 1 are
dropped:
- the reduced axes first (batch 1, [1, H, W, C] over H and W): row after row, on every CPU;
- kept axes before them too (a batch of N > 1): per item, a 1-row matrix product with a vector
  of ones, whose x86 kernel adds rows in groups of four. Another CPU's (the board's aarch64
  MLAS) may add otherwise, so this form is written only where `groups_of_four_hold` ran ORT's
  own ReduceMean beside the op on this CPU and got the same floats. At batch 8 MobileNetV3-Small's
  nine pairs took 1318 us of its 17.1 ms session as LookupF32 and ReduceMean (ORT's profiler,
  1 thread, a 2-vCPU Zen 3; docs/compile.md).

A pair is rewritten only where ONNX shape inference of the integer graph gives the ReduceMean's
input (moved channels-last where ORT moved the node's axes so) one of those forms with contiguous
axes and at least two outputs after them; the op itself refuses any other reduction at run time,
by name.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx import helper, numpy_helper

from torch_fl.bpu.conversion.export import attribute, links, splice
from torch_fl.bpu.conversion.inferred_shapes import InferredShapes, inferred_shapes
from torch_fl.bpu.conversion.lookups import DOMAIN

__all__ = ["OP", "fuse_means", "groups_of_four_hold", "pairs", "reduce_shapes"]

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
    optimized) adds in an order the op reproduces (`_order`) with one LookupMeanF32; returns how
    many. `form` 1 asks the op for its plain loop (tests compare the forms)."""
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
        order = _order(_optimized_shape(*original, axes), axes) if axes is not None else None
        if order is None:
            continue
        keepdims = attribute(node, "keepdims", 1)
        prefix = f"lookup_mean::{node.name}"
        added += [
            numpy_helper.from_array(np.array(axes, np.int64), f"{prefix}/axes"),
            numpy_helper.from_array(
                np.array([keepdims, form, order], np.int64), f"{prefix}/options"
            ),
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


def _order(shape: list[int] | None, axes: list[int]) -> int | None:
    """The op's order option for ReduceMean over `axes` of `shape`: 0 where ORT adds row after
    row (every axis before them of size 1), 1 where it adds each item's rows in groups of four
    (items before them) and does so on this CPU (`groups_of_four_hold`); None for any other
    reduction (axes not contiguous, fewer than two outputs after them, the shape unknown).
    csrc/runtime/ort_mean.cpp checks the same at run time."""
    if shape is None or axes != list(range(axes[0], axes[-1] + 1)):
        return None
    if int(np.prod(shape[axes[-1] + 1 :])) < 2:
        return None
    if all(s == 1 for s in shape[: axes[0]]):
        return 0
    return 1 if groups_of_four_hold() else None


# Rows a probe item reduces: a group of 4 then 2 then 1, several groups, one group of 2
_PROBE_ROWS = (7, 13, 2, 49)


@functools.cache
def groups_of_four_hold() -> bool:
    """Whether this CPU's ONNX Runtime adds a ReduceMean's rows over items in groups of four
    (the x86 1-row matrix product kernel), checked once a process: the op's grouped order beside
    ORT's own LookupF32 + ReduceMean on random bytes of a table spanning 18 orders of magnitude
    (sums of it round differently in any other order), for several row counts, bit for bit.
    False where they differ or either session cannot run."""
    try:
        import onnxruntime as ort

        from torch_fl import _C
    except ImportError:
        return False
    rng = np.random.default_rng(0)
    table = (rng.standard_normal(256) * np.exp(rng.uniform(-20, 20, 256))).astype(np.float32)
    inits = [numpy_helper.from_array(table, "table")]
    nodes, inputs, outputs, fused_nodes = [], [], [], []
    for i, rows in enumerate(_PROBE_ROWS):
        x, f, y = f"x{i}", f"f{i}", f"y{i}"
        inputs.append(helper.make_tensor_value_info(x, onnx.TensorProto.UINT8, [3, rows, 1, 37]))
        outputs.append(helper.make_tensor_value_info(y, onnx.TensorProto.FLOAT, None))
        nodes += [
            helper.make_node("LookupF32", ["table", x], [f], domain=DOMAIN),
            helper.make_node("ReduceMean", [f], [y], axes=[1, 2], keepdims=1),
        ]
        fused_nodes.append(
            helper.make_node(OP, ["table", x, "axes", "options"], [y], domain=DOMAIN)
        )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]
    pair = helper.make_model(
        helper.make_graph(nodes, "pair", inputs, outputs, inits), opset_imports=opsets
    )
    fused_inits = inits + [
        numpy_helper.from_array(np.array([1, 2], np.int64), "axes"),
        numpy_helper.from_array(np.array([1, 0, 1], np.int64), "options"),
    ]
    fused = helper.make_model(
        helper.make_graph(fused_nodes, "fused", inputs, outputs, fused_inits), opset_imports=opsets
    )
    feed = {
        f"x{i}": rng.integers(0, 256, (3, rows, 1, 37), dtype=np.uint8)
        for i, rows in enumerate(_PROBE_ROWS)
    }
    try:
        results = []
        for model in (pair, fused):
            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            options.log_severity_level = 3
            options.register_custom_ops_library(_C.__file__)
            session = ort.InferenceSession(
                model.SerializeToString(), options, ["CPUExecutionProvider"]
            )
            results.append(session.run(None, feed))
    except Exception:  # an ORT too old for custom ops, or one that refuses the graph
        return False
    return all(a.tobytes() == b.tobytes() for a, b in zip(*results, strict=True))

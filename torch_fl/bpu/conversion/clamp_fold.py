"""A byte clamp after one of the extension's conv and GEMM ops, folded into that op's output step.

`conversion/integer_form.py` moves a ReLU (ReLU6) after its quantization, where it is a Max with
the zero point (a Clip), and `conversion/lookups.py` makes that a `LookupU8` / `LookupI8` whose
table clamps its byte. Where the clamp reads one of the extension's ops (the pair GEMM op's 1x1
convs, the depthwise and both grouped conv ops, the one-row GEMM op's convs over one pixel), it
was a node of its own: a dispatch and a pass over the op's output, 20 of MobileNetV3-Small's 24
byte lookups on an AVX2 host (18 after PairGemm, 2 after DepthwiseConv), 16 of RegNetY-400MF's
80 on an AVX512-VNNI one (after GroupedDotConv), MobileNetV3-Small's 9 squeeze-excitation ReLUs
at batch 1 on such a host (after Gemv). Those ops requantize each output as ORT's QLinearConv
does: the float clamped to the type's range less the zero point, rounded, plus the zero point. Rounding is monotone and
the clamp's bounds are integers, so clamping the byte afterwards gives what clamping the float to
the clamp's bounds less the zero point gives: the op's geometry takes the least and greatest
output byte (csrc/runtime/ort_requant.h), and the lookup goes. The session's bytes are unchanged
(tests/compile/test_clamp_fold.py holds the folded graph to the unfolded one).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from torch_fl.bpu.conversion.export import links, splice
from torch_fl.bpu.conversion.lookups import DOMAIN

__all__ = ["BOUNDS_AT", "clamp_of", "fold_clamps"]

BOUNDS_AT = {
    "PairGemmU8": (TensorProto.UINT8, 3, 2),
    "PairGemmI8": (TensorProto.INT8, 3, 2),
    "DepthwiseConvU8": (TensorProto.UINT8, 13, 12),
    "DepthwiseConvI8": (TensorProto.INT8, 13, 12),
    "GroupedConvU8": (TensorProto.UINT8, 14, 12),
    "GroupedConvI8": (TensorProto.INT8, 14, 12),
    "GroupedDotConvU8": (TensorProto.UINT8, 14, 12),
    "GroupedDotConvI8": (TensorProto.INT8, 14, 12),
    "GemvU8": (TensorProto.UINT8, 3, 2),
    "GemvI8": (TensorProto.INT8, 3, 2),
}
"""Ops that take output bounds: (their 8-bit type, the geometry's length without bounds, where
the two bounds go in it: before the form, before a grouped conv's G)."""

_LOOKUPS = {"LookupU8": TensorProto.UINT8, "LookupI8": TensorProto.INT8}


def clamp_of(table: np.ndarray, elem_type: int) -> tuple[int, int] | None:
    """(lo, hi) where the 256-entry byte `table` (indexed by the raw byte, holding values of
    `elem_type`) is min(max(v, lo), hi) of each byte's value v; else None."""
    if table.size != 256:
        return None
    signed = elem_type == TensorProto.INT8
    values = np.arange(256, dtype=np.uint8).view(np.int8 if signed else np.uint8).astype(int)
    out = table.reshape(-1).view(np.int8 if signed else np.uint8).astype(int)
    lo, hi = int(out.min()), int(out.max())
    return (lo, hi) if np.array_equal(out, np.clip(values, lo, hi)) else None


def fold_clamps(model: onnx.ModelProto) -> int:
    """Fold, in place, each clamp lookup of ORT's optimized `model` whose input is the output of
    an op in `BOUNDS_AT` read by nothing else into that op's geometry (a new initializer of the
    op's own); returns how many. A chain of clamps folds one after the other."""
    inits = {i.name: i for i in model.graph.initializer}
    producer, reads, outputs = links(model)
    replaced: dict[int, list[onnx.NodeProto]] = {}
    dropped: set[int] = set()
    added: list[onnx.TensorProto] = []
    origin: dict[int, int] = {}  # a folded op's copy -> the id of the graph's node it replaces
    stale: set[str] = set()  # tables and geometries the folds stopped reading
    # held for the whole pass: splice matches nodes by id(), which holds only while the
    # messages' Python objects live (an id freed by one loop step went to the next step's node)
    nodes = list(model.graph.node)
    for node in nodes:
        elem_type = _LOOKUPS.get(node.op_type) if node.domain == DOMAIN else None
        op = producer.get(node.input[1]) if elem_type is not None else None
        if op is None or op.domain != DOMAIN or op.op_type not in BOUNDS_AT:
            continue
        op_type, plain, at = BOUNDS_AT[op.op_type]
        if op_type != elem_type or reads.get(op.output[0]) != 1 or op.output[0] in outputs:
            continue
        table, geometry = inits.get(node.input[0]), inits.get(op.input[4])
        bounds = clamp_of(numpy_helper.to_array(table), elem_type) if table is not None else None
        if bounds is None or geometry is None:
            continue
        values = numpy_helper.to_array(geometry).reshape(-1).tolist()
        if len(values) == plain:
            info = np.iinfo(np.int8 if elem_type == TensorProto.INT8 else np.uint8)
            values[at:at] = [int(info.min), int(info.max)]
        elif len(values) != plain + 2:
            continue
        lo, hi = bounds
        # clip(clip(v, a, b), lo, hi) is clip(v, clip(a, lo, hi), clip(b, lo, hi))
        values[at], values[at + 1] = (min(max(v, lo), hi) for v in values[at : at + 2])
        name = f"clamp_fold::{node.name or node.output[0]}/geometry"
        tensor = numpy_helper.from_array(np.array(values, np.int64), name)
        added.append(tensor)
        inits[name] = tensor
        folded = onnx.NodeProto()
        folded.CopyFrom(op)
        folded.input[4] = name
        folded.output[0] = node.output[0]
        stale.update((node.input[0], op.input[4]))
        # the op now writes the lookup's output; a clamp reading that folds into it in turn
        producer[node.output[0]] = folded
        origin[id(folded)] = origin.get(id(op), id(op))
        replaced[origin[id(folded)]] = [folded]
        dropped.add(id(node))
    if replaced:
        splice(model, replaced, dropped)
        model.graph.initializer.extend(added)
        used = {i for n in model.graph.node for i in n.input}
        kept = [i for i in model.graph.initializer if i.name not in stale or i.name in used]
        del model.graph.initializer[:]
        model.graph.initializer.extend(kept)
    return len(dropped)

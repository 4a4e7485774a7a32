"""8-bit concats in ORT's optimized sim graph as the extension's `ConcatLookup` op, with the
byte lookup that feeds each input folded in.

ONNX Runtime's `QLinearConcat` requantizes each input whose scale or zero point differs from
the output's through a 256-byte table, one byte at a time, and copies the others. Where an
input is the output of a byte lookup (conversion/lookups.py: most often a ReLU's clamp, which
the BPU's symmetric int8 puts at the zero point and QLinearConv cannot saturate at), that is a
second pass over the same bytes and a second op. GoogLeNet's inception blocks each end in
four such lookups and a concat: by ORT's profiler (batch 1, 1 thread, AVX512-VNNI EPYC), its
sim session spent 315 us in concats and 384 us in its 57 lookups, of a 10.4 ms session.

This pass replaces each `QLinearConcat` whose scales and zero points are constants with
`torch_fl.bpu.ConcatLookupU8` / `I8` (csrc/runtime/ort_concat.cpp): one table per input, the
input's requantization as ORT's own QLinearConcat computes it (run here on every byte), after
the table of the lookup that writes the input where this concat is that lookup's only reader
(the lookup then goes). So each input byte gives the byte ORT's two ops give, and the op equals
them byte for byte (tests/compile/test_concat_lookup.py).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from torch_fl.bpu.conversion.export import attribute, links, splice
from torch_fl.bpu.conversion.lookups import DOMAIN, import_domain
from torch_fl.bpu.conversion.max_pool import byte_type
from torch_fl.bpu.conversion.qlinear_conv import drop_unread

__all__ = ["OPS", "candidates", "requant_tables", "rewrite_concats"]

OPS = {TensorProto.UINT8: "ConcatLookupU8", TensorProto.INT8: "ConcatLookupI8"}
_LOOKUPS = {TensorProto.UINT8: "LookupU8", TensorProto.INT8: "LookupI8"}
_NUMPY = {TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8}


def candidates(model: onnx.ModelProto) -> int:
    """How many Concat nodes of the integer graph `model` (before ORT's optimizer) join only
    dequantized tensors, the form ORT fuses into a QLinearConcat; `rewrite_concats` decides each
    on ORT's optimized graph. (A concat of float or shape tensors alone, as a ViT's class token
    makes, is no reason to spend an ORT optimization pass.)"""
    producer = {o: n for n in model.graph.node for o in n.output}
    return sum(
        node.op_type == "Concat"
        and all(
            name in producer and producer[name].op_type == "DequantizeLinear" for name in node.input
        )
        for node in model.graph.node
    )


def rewrite_concats(model: onnx.ModelProto, form: int = 0) -> tuple[int, int]:
    """Replace, in place, each QLinearConcat of constant scales and zero points in ORT's
    optimized `model` with a ConcatLookup op of the extension, folding in the byte lookups
    that only it reads; returns (concats replaced, lookups folded). `form` 1 asks the op for its
    plain loop (tests compare the forms)."""
    inits = {i.name: i for i in model.graph.initializer}
    producer, reads, outputs = links(model)
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    inputs = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    found = []  # (node, kind, output (scale, zero point), each input's (scale, zero point))
    for node in model.graph.node:
        spec = _constant_params(node, inits)
        if spec is None:
            continue
        kind = byte_type(node.output[0], producer, readers, inits, inputs)
        if kind not in OPS or any(
            byte_type(x, producer, readers, inits, inputs) != kind for x in node.input[2::3]
        ):
            continue
        found.append((node, kind, *spec))
    if not found:
        return 0, 0
    tables = requant_tables([(kind, out, ins) for _, kind, out, ins in found])
    replaced: dict[int, list[onnx.NodeProto]] = {}
    dropped: set[int] = set()
    added: list[onnx.TensorProto] = []
    folded = 0
    for (node, kind, _, _), table in zip(found, tables, strict=True):
        xs = list(node.input[2::3])
        for i, x in enumerate(xs):
            lookup = producer.get(x)
            inner = _foldable(lookup, kind, x, reads, outputs, inits, producer, readers, inputs)
            if inner is None or id(lookup) in dropped:
                continue
            table[i] = table[i][inner.view(np.uint8)]
            xs[i] = lookup.input[1]
            dropped.add(id(lookup))
            folded += 1
        # named by its output, which no other node writes (node names may repeat or be empty)
        prefix = f"concat_lookup::{node.output[0]}"
        axis = int(attribute(node, "axis", 0))
        added.append(numpy_helper.from_array(table.view(_NUMPY[kind]), f"{prefix}::tables"))
        added.append(numpy_helper.from_array(np.array([axis, form], np.int64), prefix))
        replaced[id(node)] = [
            helper.make_node(
                OPS[kind], [f"{prefix}::tables", prefix, *xs], [node.output[0]], name=prefix,
                domain=DOMAIN,
            )
        ]  # fmt: skip
    splice(model, replaced, dropped)
    model.graph.initializer.extend(added)
    drop_unread(model)
    import_domain(model)
    return len(replaced), folded


def requant_tables(
    concats: list[tuple[int, tuple[float, int], list[tuple[float, int]]]],
) -> list[np.ndarray]:
    """For each concat (its byte type, its output's (scale, zero point), each input's), the
    [inputs, 256] uint8 table of what ONNX Runtime's QLinearConcat writes for every byte of each
    input: the concats run in one session over every byte (the requantization is per byte, so a
    [256, 1] input per x, joined along axis 1, gives the table as the output's columns)."""
    import onnxruntime as ort

    nodes, graph_inputs, graph_outputs, inits = [], [], [], []
    for c, (kind, (y_scale, y_zp), params) in enumerate(concats):
        np_kind = _NUMPY[kind]
        names = [f"c{c}_y_scale", f"c{c}_y_zp"]
        inits += [numpy_helper.from_array(np.array(y_scale, np.float32), names[0]),
                  numpy_helper.from_array(np.array(y_zp, np_kind), names[1])]  # fmt: skip
        for i, (scale, zp) in enumerate(params):
            x = f"c{c}_x{i}"
            graph_inputs.append(helper.make_tensor_value_info(x, kind, [256, 1]))
            inits += [numpy_helper.from_array(np.array(scale, np.float32), f"{x}_scale"),
                      numpy_helper.from_array(np.array(zp, np_kind), f"{x}_zp")]  # fmt: skip
            names += [x, f"{x}_scale", f"{x}_zp"]
        out = f"c{c}_y"
        nodes.append(
            helper.make_node("QLinearConcat", names, [out], axis=1, domain="com.microsoft")
        )
        graph_outputs.append(helper.make_tensor_value_info(out, kind, [256, len(params)]))
    model = helper.make_model(
        helper.make_graph(nodes, "requant_tables", graph_inputs, graph_outputs, inits),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
    )
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    every = np.arange(256, dtype=np.uint8).reshape(256, 1)
    feeds = {i.name: every.view(_NUMPY[i.type.tensor_type.elem_type]) for i in graph_inputs}
    return [np.ascontiguousarray(r.view(np.uint8).T) for r in session.run(None, feeds)]


def _constant_params(
    node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]
) -> tuple[tuple[float, int], list[tuple[float, int]]] | None:
    """((scale, zero point) of the output, those of each input) of a QLinearConcat whose every
    scale and zero point is a one-value initializer, else None (the node stays ORT's)."""
    if node.op_type != "QLinearConcat" or node.domain != "com.microsoft" or len(node.output) != 1:
        return None
    if len(node.input) < 5 or (len(node.input) - 2) % 3:
        return None
    values = []
    for name in [node.input[0], node.input[1], *(n for i, n in enumerate(node.input[2:]) if i % 3)]:
        init = inits.get(name)
        if init is None:
            return None
        value = numpy_helper.to_array(init)
        if value.size != 1:
            return None
        values.append(value.reshape(()).item())
    pairs = [(float(values[i]), int(values[i + 1])) for i in range(0, len(values), 2)]
    return pairs[0], pairs[1:]


def _foldable(lookup, kind, x, reads, outputs, inits, producer, readers, inputs):
    """The table of `lookup`, the byte lookup that writes concat input `x`, where it may fold
    into the concat: a Lookup of the concat's type over bytes of that type, with a constant
    table, whose output only this concat reads once. Else None."""
    if lookup is None or lookup.domain != DOMAIN or lookup.op_type != _LOOKUPS[kind]:
        return None
    if reads.get(x, 0) != 1 or x in outputs or len(lookup.input) != 2:
        return None
    table = inits.get(lookup.input[0])
    if table is None or byte_type(lookup.input[1], producer, readers, inits, inputs) != kind:
        return None
    value = numpy_helper.to_array(table)
    return value.reshape(-1) if value.size == 256 else None

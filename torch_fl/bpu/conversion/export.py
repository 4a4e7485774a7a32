"""Export a frozen partition to ONNX with stable, unique tensor names.

The TorchScript exporter (`dynamo=False`) is used because it costs 0.02-1.4 s per partition
against a fixed 1-2 s for the dynamo exporter; the rewrites in `lowering` make every supported op
expressible. Inputs are named after the partition's placeholders and outputs `output_<i>`, so the
names identify the same tensor in every build and across processes (calibration data and the
board runtime refer to them).
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence

import onnx
import torch
from torch import fx

from torch_fl.bpu.errors import ExportError

OPSET = 17


def export_onnx(
    gm: fx.GraphModule, inputs: Sequence[torch.Tensor], input_names: Sequence[str]
) -> onnx.ModelProto:
    """Export `gm` (all placeholders are runtime inputs) and run ONNX shape inference."""
    n_out = len(_output_values(gm))
    output_names = [f"output_{i}" for i in range(n_out)]
    buffer = io.BytesIO()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                gm,
                tuple(inputs),
                buffer,
                input_names=list(input_names),
                output_names=output_names,
                opset_version=OPSET,
                do_constant_folding=True,
                dynamo=False,
            )
    except Exception as exc:  # the exporter raises many types; name the partition's ops
        ops = sorted({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        raise ExportError(
            f"ONNX export of a BPU partition failed ({type(exc).__name__}: {exc}). Ops in the "
            f"partition: {', '.join(ops)}. Fix: report the op, or run this model with "
            "options={'executor': 'eager'}."
        ) from exc
    model = onnx.load_from_string(buffer.getvalue())
    if len(model.graph.input) != len(input_names):
        # The tracer lost the inputs (everything was folded into constants): never ship that.
        raise ExportError(
            f"ONNX export traced {len(model.graph.input)} of {len(input_names)} inputs; the "
            "partition would be a constant. Fix: report this with the model that triggers it."
        )
    _strip_volatile(model)
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def _output_values(gm: fx.GraphModule) -> list:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    value = out.args[0]
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _strip_volatile(model: onnx.ModelProto) -> None:
    """Drop fields that vary between runs/versions but not in meaning (doc strings, producer)."""
    model.producer_version = ""
    model.doc_string = ""
    model.graph.doc_string = ""
    for node in model.graph.node:
        node.doc_string = ""
    del model.metadata_props[:]


def attribute(node: onnx.NodeProto, name: str, default=None):
    """The value of `node`'s attribute `name`, or `default` when the node does not set it."""
    for attr in node.attribute:
        if attr.name == name:
            return onnx.helper.get_attribute_value(attr)
    return default


def splice(
    model: onnx.ModelProto,
    replaced: dict[int, list[onnx.NodeProto]],
    dropped: set[int] | frozenset[int] = frozenset(),
) -> None:
    """Rewrite `model`'s node list in place: each node whose `id()` is a key of `replaced`
    becomes that list of nodes, at its position; each in `dropped` goes; the rest stay in
    order. (The ids are those of `model.graph.node`'s own messages, taken before the call.)"""
    nodes = [
        new
        for node in model.graph.node
        if id(node) not in dropped
        for new in replaced.get(id(node), [node])
    ]
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def links(model: onnx.ModelProto) -> tuple[dict[str, onnx.NodeProto], dict[str, int], set[str]]:
    """(the node that writes each tensor, how many node inputs read each tensor, the graph's
    outputs): what a rewrite checks before it takes a tensor's only reader away."""
    producer = {o: n for n in model.graph.node for o in n.output}
    reads: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            reads[name] = reads.get(name, 0) + 1
    return producer, reads, {o.name for o in model.graph.output}


def constant_names(model: onnx.ModelProto) -> set[str]:
    """Tensors whose value is fixed in the graph: initializers and Constant node outputs (the
    exporter writes literals such as ReLU6's 0 and 6 as Constant nodes)."""
    names = {i.name for i in model.graph.initializer}
    names.update(n.output[0] for n in model.graph.node if n.op_type == "Constant" and n.output)
    return names


def constant_value(model: onnx.ModelProto, name: str):
    """The numpy value of initializer or Constant output `name`, or None."""
    from onnx import numpy_helper

    for init in model.graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output and node.output[0] == name:
            value = attribute(node, "value")
            return numpy_helper.to_array(value) if value is not None else None
    return None


def canonical_bytes(model: onnx.ModelProto) -> bytes:
    """Deterministic serialization: the cache key hashes exactly these bytes."""
    return model.SerializeToString(deterministic=True)

"""The integer graph's tensor shapes by ONNX shape inference, where known in full.

Some session-graph passes decide on ORT's optimized graph what only the integer graph before
ORT's optimizer tells: a ReduceMean's input shape (conversion/lookup_mean.py), a Gemm's row
count (conversion/gemv.py). ORT keeps those nodes' names, so the passes read the shapes here by
node name. Inference runs once per graph (conversion/session_graph.py passes the result to
both).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx

__all__ = ["InferredShapes", "inferred_shapes"]


@dataclass(frozen=True)
class InferredShapes:
    graph: onnx.GraphProto | None
    """The inferred graph (its nodes and initializers); None where inference failed."""
    dims: dict[str, list[int]] = field(default_factory=dict)
    """Each tensor whose every dimension has a size (not a symbol): its sizes."""


def inferred_shapes(model: onnx.ModelProto | InferredShapes) -> InferredShapes:
    """`model`'s shapes (an `InferredShapes` is returned as it is)."""
    if isinstance(model, InferredShapes):
        return model
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001  (no shapes: no pass that needs them takes a node)
        return InferredShapes(None)
    dims: dict[str, list[int]] = {}
    for info in (*inferred.input, *inferred.value_info, *inferred.output):
        tensor = info.type.tensor_type
        if tensor.HasField("shape") and all(d.HasField("dim_value") for d in tensor.shape.dim):
            dims[info.name] = [d.dim_value for d in tensor.shape.dim]
    return InferredShapes(inferred, dims)

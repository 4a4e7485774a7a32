"""One layer alone: a weight op with its input quantized as chosen, measured against float.

`alone_model` is the graph of one Conv / Gemm / MatMul of a partition, its activation input a
graph input, quantized int8 / int16 or left float (layer_report's `cosine_alone` uses it).

`int16_shortfalls` is calibrate(target=...)'s health check after the ladder: every layer whose
input the ladder moved to int16 and whose own cosine with that int16 input (its weights stay
int8) is still below the target on the calibration samples, named by module path
(`features.3.conv.1`, layer_select.py), with what became of it: moved to float by the ladder,
or still below target. A partition can meet its output target while one layer of it does not;
this says which layer int16 was not enough for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx

from torch_fl.bpu.conversion.calibration import RangeObserver, _cosine, _session
from torch_fl.bpu.conversion.layer_select import module_paths, weight_ops
from torch_fl.bpu.conversion.qdq import quantize_model


def alone_model(
    model: onnx.ModelProto,
    node: onnx.NodeProto,
    inits: Mapping[str, onnx.TensorProto],
    scales: Mapping[str, float],
    default: float,
    precision: str,
    shapes: tuple[Sequence[int], Sequence[int]],
) -> onnx.ModelProto:
    """A graph of `node` alone: its activation input a graph input, its weights and bias as in
    `model`, quantized as the partition quantizes it (int8, int16) or left float."""
    value = onnx.helper.make_tensor_value_info(node.input[0], onnx.TensorProto.FLOAT, shapes[0])
    out = onnx.helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, shapes[1])
    graph = onnx.helper.make_graph(
        [node], "alone", [value], [out], [inits[n] for n in node.input[1:] if n in inits]
    )
    single = onnx.helper.make_model(graph, opset_imports=list(model.opset_import))
    single.ir_version = model.ir_version
    return quantize_model(single, scales, default, {node.input[0]: precision})


def with_outputs(model: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    """A copy of `model` that also outputs the tensors `names`."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    have = {o.name for o in out.graph.output}
    out.graph.output.extend(
        onnx.helper.make_empty_tensor_value_info(n) for n in names if n not in have
    )
    return out


def alone_cosine(
    model: onnx.ModelProto,
    node: onnx.NodeProto,
    scales: Mapping[str, float],
    default: float,
    precision: str,
    inputs: Sequence[np.ndarray],
    refs: Sequence[np.ndarray],
) -> float:
    """The worst cosine over the samples of `node` alone (its input at `precision`, fed the
    float network's values `inputs`) against the float network's outputs `refs`."""
    inits = {i.name: i for i in model.graph.initializer}
    shapes = (list(np.asarray(inputs[0]).shape), list(np.asarray(refs[0]).shape))
    session = _session(alone_model(model, node, inits, scales, default, precision, shapes))
    act, out = node.input[0], node.output[0]
    return min(
        _cosine(np.asarray(session.run([out], {act: x})[0]), np.asarray(r))
        for x, r in zip(inputs, refs, strict=True)
    )


def int16_shortfalls(
    observer: RangeObserver,
    scales: Mapping[str, float],
    default: float,
    promoted: Iterable[str],
    final: Mapping[str, str],
    target: float,
    gm=None,
) -> list[dict]:
    """The layers reading a tensor in `promoted` (moved to int16 by the ladder) whose own cosine
    with that input in int16 is below `target` on the kept samples: {"module", "op", "tensor",
    "cosine", "precision" (the tensor's final one), "message"}, in network order. `gm` (the
    partition's FX graph) gives module paths; without it the ONNX node names stand."""
    promoted = set(promoted)
    model = observer.model
    nodes = [n for n in weight_ops(model) if n.input[0] in promoted]
    if not nodes or not observer.kept_inputs:
        return []
    paths = module_paths(gm, model) if gm is not None else {}
    feeds = [dict(zip(observer.input_names, i, strict=False)) for i in observer.kept_inputs]
    acts = sorted({n.input[0] for n in nodes} - set(observer.input_names))
    names = [n.output[0] for n in nodes] + acts
    reference = _session(with_outputs(model, names))
    values = [dict(zip(names, reference.run(names, f), strict=True)) | f for f in feeds]
    rows = []
    for node in nodes:
        act = node.input[0]
        cos = alone_cosine(
            model, node, scales, default, "int16",
            [v[act] for v in values], [v[node.output[0]] for v in values],
        )  # fmt: skip
        if cos >= target:
            continue
        module = paths.get(node.name or node.output[0]) or node.name or node.output[0]
        now = final.get(act, "int8")
        outcome = {"float": "moved to float", "dual_int16": "moved to dual int16"}.get(
            now, "still below target"
        )
        rows.append({
            "module": module, "op": node.op_type, "tensor": act, "cosine": round(cos, 6),
            "precision": now,
            "message": f"int16 not enough: {module} ({node.op_type}, cosine {cos:.6f} < "
                       f"{target}); {outcome}",
        })  # fmt: skip
    return rows

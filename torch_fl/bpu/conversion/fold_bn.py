"""Fold each inference BatchNormalization into the Conv before it, in the exported ONNX graph.

The BPU (and every int8 toolchain) quantizes the *folded* convolution: one per-channel int8
weight w' = w * gamma / sqrt(var + eps) and one bias b' = (b - mean) * gamma / sqrt(var + eps)
+ beta, so the conv's int32 accumulator carries the normalisation and its output can be
requantized straight away (what lets the sim executor use fused int8 kernels). Quantizing w and
then running BN in float would put a float op between every conv and its output quantization.

The fold is written as ONNX nodes over the weight tensors, not evaluated: the graph's frozen
weights are graph inputs here (conversion/live_weights.py), so the folded values are computed
from the live parameters wherever the weight-only part of the graph is evaluated, and the eager
executor (the FX graph) is untouched.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from torch_fl.bpu.conversion.export import attribute, splice


class _Folder:
    def __init__(self, model: onnx.ModelProto, weights: Sequence[str]) -> None:
        graph = model.graph
        self.constant = set(weights) | {i.name for i in graph.initializer}
        self.types = {v.name: v for v in list(graph.input) + list(graph.value_info)}
        self.readers: dict[str, int] = {}
        for node in graph.node:
            for name in node.input:
                self.readers[name] = self.readers.get(name, 0) + 1
        self.outputs = {o.name for o in graph.output}
        self.inits: list[onnx.TensorProto] = []
        self.infos: list[onnx.ValueInfoProto] = []

    def const(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def foldable(self, conv: onnx.NodeProto | None, bn: onnx.NodeProto) -> bool:
        if conv is None or conv.op_type != "Conv" or bn.op_type != "BatchNormalization":
            return False
        if attribute(bn, "training_mode", 0) or len(bn.output) != 1:
            return False
        if conv.input[1] not in self.types:  # its rank shapes gamma's broadcast
            return False
        out = conv.output[0]
        if self.readers.get(out, 0) != 1 or out in self.outputs:
            return False
        params = [n for n in list(conv.input[1:]) + list(bn.input[1:5]) if n]
        return len(bn.input) == 5 and all(n in self.constant for n in params)

    def fold(self, conv: onnx.NodeProto, bn: onnx.NodeProto) -> list[onnx.NodeProto]:
        """Nodes computing w' and b' from the weights, and the conv that replaces both."""
        tag = f"bnfold::{bn.output[0]}"
        gamma, beta, mean, var = bn.input[1:5]
        weight = conv.input[1]
        eps = float(attribute(bn, "epsilon", 1e-5))
        eps_name = self.const(f"{tag}/eps", np.array(eps, np.float32))
        rank = len(self.types[weight].type.tensor_type.shape.dim)
        shape = self.const(f"{tag}/shape", np.array([-1] + [1] * (rank - 1), np.int64))
        names = {k: f"{tag}/{k}" for k in ("var_eps", "std", "k", "k_w", "w", "shift", "b")}
        nodes = [
            helper.make_node("Add", [var, eps_name], [names["var_eps"]]),
            helper.make_node("Sqrt", [names["var_eps"]], [names["std"]]),
            helper.make_node("Div", [gamma, names["std"]], [names["k"]]),
            helper.make_node("Reshape", [names["k"], shape], [names["k_w"]]),
            helper.make_node("Mul", [weight, names["k_w"]], [names["w"]]),
        ]
        bias = conv.input[2] if len(conv.input) > 2 and conv.input[2] else None
        if bias is not None:
            centred = f"{tag}/centred"
            nodes.append(helper.make_node("Sub", [bias, mean], [centred]))
            nodes.append(helper.make_node("Mul", [centred, names["k"]], [names["shift"]]))
            nodes.append(helper.make_node("Add", [names["shift"], beta], [names["b"]]))
        else:
            nodes.append(helper.make_node("Mul", [mean, names["k"]], [names["shift"]]))
            nodes.append(helper.make_node("Sub", [beta, names["shift"]], [names["b"]]))
        # live_weights reads each quantized weight's rank from value_info
        info = onnx.ValueInfoProto()
        info.CopyFrom(self.types[weight])
        info.name = names["w"]
        self.infos.append(info)
        self.infos.append(helper.make_tensor_value_info(names["b"], onnx.TensorProto.FLOAT, None))
        folded = onnx.NodeProto()
        folded.CopyFrom(conv)
        del folded.input[:]
        folded.input.extend([conv.input[0], names["w"], names["b"]])
        del folded.output[:]
        folded.output.append(bn.output[0])
        return [*nodes, folded]


def fold_batchnorm(model: onnx.ModelProto, weights: Sequence[str]) -> tuple[onnx.ModelProto, int]:
    """A copy of `model` with every Conv -> BatchNormalization (inference, constant parameters,
    the conv's output read by the BN only) folded into one Conv; and how many were folded."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    folder = _Folder(out, weights)
    producer = {o: n for n in out.graph.node for o in n.output}
    replaced: dict[int, list[onnx.NodeProto]] = {}
    dropped: set[int] = set()
    for node in out.graph.node:
        if node.op_type != "BatchNormalization":
            continue
        conv = producer.get(node.input[0])
        if folder.foldable(conv, node):
            replaced[id(node)] = folder.fold(conv, node)
            dropped.add(id(conv))
    if not replaced:
        return out, 0
    splice(out, replaced, dropped)
    out.graph.initializer.extend(folder.inits)
    out.graph.value_info.extend(folder.infos)
    return out, len(replaced)

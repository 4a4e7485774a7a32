"""Layers by the names users know: module paths (`features.3.conv.1`) and op types.

The FX graph of a partition knows each op's module (Dynamo's nn_module_stack); its ONNX export
knows the tensors. The two are matched per kind (conv, matmul) in graph order, which the
exporter keeps; where the counts differ (an exporter that split or fused ops of a kind) that
kind is left unmatched rather than guessed. `select` turns the `int16` / `float` options
(module globs, op types, ONNX tensor names) into the activation tensors they name.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

import onnx
import torch

from torch_fl.bpu.conversion.qdq import WEIGHT_OPS

FX_KINDS = {
    "convolution": "conv",
    "conv2d": "conv",
    "conv1d": "conv",
    "addmm": "matmul",
    "mm": "matmul",
    "linear": "matmul",
    "bmm": "matmul",
    "matmul": "matmul",
}
ONNX_KINDS = {"Conv": "conv", "Gemm": "matmul", "MatMul": "matmul"}


def _module_of(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    # "L['self'].features.3" / "L['fn'].0" -> "features.3" / "0"
    for prefix in ("L['self'].", "L['fn'].", "L['model'].", "L['mod']."):
        if path.startswith(prefix):
            return path[len(prefix) :]
    return path.split("].", 1)[-1] if "]." in path else path


def module_paths(gm: torch.fx.GraphModule, model: onnx.ModelProto) -> dict[str, str]:
    """ONNX weight-op node name -> module path, matched in order within each kind (conv /
    matmul); empty where the two graphs do not line up (then the ONNX names stand)."""
    fx = {"conv": [], "matmul": []}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        name = getattr(node.target, "__name__", str(node.target)).split(".")[0]
        kind = FX_KINDS.get(name)
        if kind:
            fx[kind].append(_module_of(node))
    inits = {i.name for i in model.graph.initializer}
    ox = {"conv": [], "matmul": []}
    for node in model.graph.node:
        kind = ONNX_KINDS.get(node.op_type)
        widx = WEIGHT_OPS.get(node.op_type)
        if kind and widx is not None and len(node.input) > widx:
            ox[kind].append((node, node.input[widx] in inits))
    out: dict[str, str] = {}
    for kind in ("conv", "matmul"):
        if len(fx[kind]) != len(ox[kind]):
            continue  # an exporter that split or fused ops of this kind: no safe match
        for path, (node, _) in zip(fx[kind], ox[kind], strict=True):
            if path:
                out[node.name or node.output[0]] = path
    return out


def weight_ops(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The Conv / Gemm / MatMul nodes with a constant weight, in graph order."""
    inits = {i.name for i in model.graph.initializer}
    return [
        n for n in model.graph.node
        if n.op_type in WEIGHT_OPS and len(n.input) > WEIGHT_OPS[n.op_type]
        and n.input[WEIGHT_OPS[n.op_type]] in inits
    ]  # fmt: skip


def select(
    gm: torch.fx.GraphModule, model: onnx.ModelProto, patterns: Iterable[str]
) -> tuple[set[str], set[str]]:
    """(input activation tensors of the layers `patterns` name, the patterns that named none).

    A pattern names a layer when it equals its op type, globs its module path, or equals its
    input tensor's ONNX name."""
    paths = module_paths(gm, model)
    chosen: set[str] = set()
    used: set[str] = set()
    for node in weight_ops(model):
        module = paths.get(node.name or node.output[0], "")
        for pattern in patterns:
            if (
                pattern == node.op_type
                or pattern == node.input[0]
                or (module and fnmatch.fnmatchcase(module, pattern))
            ):
                chosen.add(node.input[0])
                used.add(pattern)
    return chosen, set(patterns) - used

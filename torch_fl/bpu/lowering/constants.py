"""Compile-time folding of subgraphs that depend on no graph input at all.

Attention masks (causal, Swin's shifted-window regions), `arange` index arithmetic and similar
tensors are computed from shapes and literals only. Left in the graph they are int64/bool ops the
BPU does not take, so they ran on the CPU on every call and cut partitions. They are evaluated
once here, with real tensors, and replaced by one constant (a buffer of the graph module) per
value the rest of the graph reads; the backend passes those to partitions as frozen inputs, so
they become ONNX initializers.

Subgraphs that read parameters or buffers are not folded here (their values are only known at
the first call and may change later): they stay in the partition, where the export pipeline
evaluates its weight-only part with the live weights.
"""

from __future__ import annotations

import torch
from torch import fx
from torch.utils._python_dispatch import _disable_current_modes

# Folding must not turn a small graph into a huge constant (e.g. a broadcast expanded to MBs).
MAX_FOLDED_BYTES = 16 << 20
PREFIX = "_bpu_folded_"


def _deterministic(node: fx.Node) -> bool:
    tags = getattr(node.target, "tags", ())
    return torch.Tag.nondeterministic_seeded not in tags


def _bytes(val) -> int:
    return val.numel() * val.element_size() if isinstance(val, torch.Tensor) else 0


def input_independent(gm: fx.GraphModule) -> set[fx.Node]:
    """call_function/get_attr nodes whose value depends on no placeholder."""
    dependent: set[fx.Node] = set()
    constant: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            dependent.add(node)
        elif node.op == "get_attr":
            constant.add(node)
        elif node.op == "call_function":
            inputs = node.all_input_nodes
            if any(i in dependent or i not in constant for i in inputs):
                dependent.add(node)
            elif _deterministic(node):
                constant.add(node)
            else:
                dependent.add(node)
    return constant


def _real(value):
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(value, FakeTensor):
        raise LookupError("fake constant")
    return value


def fold_constants(gm: fx.GraphModule) -> int:
    """Fold input-independent call_function nodes into buffers; return how many were folded."""
    constant = input_independent(gm)
    computed = [n for n in gm.graph.nodes if n in constant and n.op == "call_function"]
    if not computed:
        return 0
    frontier = [n for n in computed if any(u not in constant for u in n.users)]
    if not frontier:
        return 0
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    values: dict[fx.Node, object] = {}
    with _disable_current_modes(), unset_fake_temporarily(), torch.no_grad():
        for node in gm.graph.nodes:
            if node not in constant:
                continue
            try:
                if node.op == "get_attr":
                    values[node] = _real(getattr(gm, node.target))
                    continue
                args = fx.map_arg(node.args, lambda a: values[a])
                kwargs = fx.map_arg(node.kwargs, lambda a: values[a])
                value = node.target(*args, **kwargs)
                # a private copy: the graph must not alias a tensor anything else may mutate
                values[node] = value.detach().clone() if isinstance(value, torch.Tensor) else value
            except Exception:  # not evaluable here: the node stays (and is judged normally)
                continue
    folded = 0
    for index, node in enumerate(frontier):
        value = values.get(node)
        if not isinstance(value, torch.Tensor) or _bytes(value) > MAX_FOLDED_BYTES:
            continue
        name = f"{PREFIX}{index}"
        while hasattr(gm, name):
            name += "_"
        gm.register_buffer(name, value)
        with gm.graph.inserting_before(node):
            const = gm.graph.get_attr(name)
        const.meta = dict(node.meta)
        node.replace_all_uses_with(const)
        folded += 1
    if folded:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return folded

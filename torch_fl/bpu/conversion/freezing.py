"""Bake parameters/buffers into a partition so they become ONNX initializers.

Weights that cross the host/BPU boundary on every call made the earlier backend 3x slower than
eager, so frozen weights are constants of the artifact. The price is staleness: a later in-place
update (`load_state_dict`, an optimizer step) must be noticed. `FrozenWeights.stale` compares the
tensors a call passes against the frozen ones by identity and version counter, which costs well
under a microsecond per weight.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import fx


class FrozenWeights:
    """The weights one build of a partition baked in, to detect later changes."""

    __slots__ = ("entries",)

    def __init__(self, positions: Sequence[int], args: Sequence[torch.Tensor]) -> None:
        self.entries = tuple((pos, args[pos], args[pos]._version) for pos in positions)

    def stale(self, args: Sequence[torch.Tensor]) -> bool:
        for pos, tensor, version in self.entries:
            current = args[pos]
            if current is not tensor or current._version != version:
                return True
        return False


def freeze(
    gm: fx.GraphModule, frozen_positions: Sequence[int], args: Sequence[torch.Tensor]
) -> fx.GraphModule:
    """A copy of `gm` whose placeholders at `frozen_positions` are constants from `args`."""
    frozen = set(frozen_positions)
    graph = fx.Graph()
    root = torch.nn.Module()
    env: dict[fx.Node, fx.Node] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for index, node in enumerate(placeholders):
        if index in frozen:
            attr = f"_frozen_{index}"
            # detach + clone: the artifact must not alias a tensor the user may mutate later.
            root.register_buffer(attr, args[index].detach().clone())
            env[node] = graph.get_attr(attr)
        else:
            env[node] = graph.placeholder(node.name)
        env[node].meta = dict(node.meta)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
    out = fx.GraphModule(root, graph)
    out.recompile()
    return out

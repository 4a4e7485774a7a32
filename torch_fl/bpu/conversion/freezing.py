"""Change detection for weights baked into an artifact (the hbm executor's .hbm file).

Host executors never bake weights (sim reads them as graph inputs, eager runs the FX graph), so
only an artifact that must hold its weights needs this. Version counters alone miss writes
through `.data`, `p.data = ...` and numpy views, so each call checks, per weight:
identity (same tensor object, data pointer, storage size, version counter) and then content
(every byte against a private copy taken when the artifact was built). The content compare is a
memcmp-speed pass over the weights (measured in scripts/bench_compile.py); the copy costs as much
memory as the weights themselves.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.detach().reshape(-1)  # a view when contiguous, a copy otherwise
    return flat.view(torch.uint8) if flat.numel() else flat


class FrozenWeights:
    """The weights one build of a partition baked in, to detect any later change."""

    __slots__ = ("entries",)

    def __init__(self, positions: Sequence[int], args: Sequence[torch.Tensor]) -> None:
        self.entries = tuple(
            (
                pos,
                args[pos],
                args[pos].data_ptr(),
                args[pos].untyped_storage().nbytes(),
                args[pos]._version,
                tuple(args[pos].stride()),
                _bytes(args[pos]).clone(),
            )
            for pos in positions
        )

    def stale(self, args: Sequence[torch.Tensor]) -> bool:
        for pos, tensor, ptr, nbytes, version, strides, snapshot in self.entries:
            current = args[pos]
            if (
                current is not tensor
                or current.data_ptr() != ptr
                or current._version != version
                or current.untyped_storage().nbytes() != nbytes
                or current.stride() != strides
            ):
                return True
            if not torch.equal(_bytes(current), snapshot):
                return True
        return False

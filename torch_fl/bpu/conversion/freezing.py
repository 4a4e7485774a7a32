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

import ctypes
from collections.abc import Sequence

import torch

_libc = ctypes.CDLL(None)
_memcmp = _libc.memcmp
_memcmp.restype = ctypes.c_int
_memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


def _snapshot(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().clone()


def _same_content(current: torch.Tensor, snapshot: torch.Tensor) -> bool:
    """Byte equality (NaN == NaN here): memcmp for a contiguous tensor, the fastest pass measured
    (1.5x torch.equal on int64 views, 4x on bytes)."""
    nbytes = snapshot.numel() * snapshot.element_size()
    dense = current.detach().contiguous()  # held in a name: memcmp reads its memory
    return _memcmp(dense.data_ptr(), snapshot.data_ptr(), nbytes) == 0


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
                _snapshot(args[pos]),
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
            if not _same_content(current, snapshot):
                return True
        return False

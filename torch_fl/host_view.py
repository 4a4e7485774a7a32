"""CPU views of `flagos` tensors, for code that needs CPU tensors (numpy, ONNX Runtime).

flagos memory is host-mapped (UCP) or plain host memory, so a CPU tensor over the same bytes is
a view, not a copy: the same thing the eager device's CPU fallback does. The view does not own
the memory; whoever takes one keeps the flagos tensor alive while using it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torch_fl._C import _cpu_view, _from_cpu
from torch_fl.device import DEVICE_TYPE


def is_flagos(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == DEVICE_TYPE


def cpu_view(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` itself if it is not on flagos, else a zero-copy CPU view of it (detached)."""
    if tensor.device.type != DEVICE_TYPE:
        return tensor
    return _cpu_view(tensor.detach())


def cpu_views(args: Sequence[Any]) -> tuple[Any, ...]:
    """Each flagos tensor of `args` as a CPU view; everything else as it is."""
    return tuple(cpu_view(a) if isinstance(a, torch.Tensor) else a for a in args)


def device_of(args: Sequence[Any]) -> torch.device | None:
    """The flagos device of the first flagos tensor in `args`, or None when there is none."""
    for a in args:
        if is_flagos(a):
            return a.device
    return None


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU result as a flagos tensor on `device` (adopted without a copy on host memory)."""
    return _from_cpu(tensor, device.index or 0)

"""`torch.flagos`: the Python device module of the flagos (RDK BPU) device.

PyTorch finds device-specific helpers (RNG state, streams, memory stats, AMP dtypes) through the
module registered for the backend's name, the way `torch.cuda` serves CUDA. Everything here is a
thin layer over `torch_fl._C` or over PyTorch's generic `torch.Stream` / `torch.Event`, which
reach the C++ device guard (csrc/runtime/device_guard.cpp).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from torch_fl import _C

DEVICE_TYPE = "flagos"

__all__ = [
    "Event",
    "Stream",
    "current_device",
    "current_stream",
    "default_stream",
    "device",
    "device_count",
    "empty_cache",
    "get_rng_state",
    "initial_seed",
    "is_available",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_backend",
    "memory_reserved",
    "memory_stats",
    "reset_peak_memory_stats",
    "seed",
    "set_device",
    "set_rng_state",
    "set_stream",
    "stream",
    "synchronize",
]


def _index(dev: Any = None) -> int:
    """Device index of `dev` (None, int, str or torch.device); flagos only."""
    if dev is None:
        return _C._current_device()
    if isinstance(dev, int):
        return dev
    d = torch.device(dev)
    if d.type != DEVICE_TYPE:
        raise ValueError(f"expected a flagos device, got {d}; use 'flagos' or 'flagos:0'")
    return _C._current_device() if d.index is None else d.index


# --- device -------------------------------------------------------------------------------


def is_available() -> bool:
    """True: the device exists wherever torch_fl imports (host memory when no board)."""
    return True


def is_initialized() -> bool:
    return True


def _lazy_init() -> None:
    """Nothing to initialise lazily: the runtime loads on the first allocation."""


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return _C._device_count()


def current_device() -> int:
    return _C._current_device()


def set_device(dev: Any) -> None:
    _C._set_device(_index(dev))


class device:  # noqa: N801 - mirrors torch.cuda.device
    """Context manager that makes `dev` the current flagos device."""

    def __init__(self, dev: Any) -> None:
        self.idx = _index(dev)
        self.prev = -1

    def __enter__(self) -> None:
        self.prev = current_device()
        set_device(self.idx)

    def __exit__(self, *exc: object) -> None:
        set_device(self.prev)


def synchronize(dev: Any = None) -> None:
    """Wait for the device. Submission is synchronous, so this returns at once."""
    torch.accelerator.synchronize(torch.device(DEVICE_TYPE, _index(dev)))


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float16, torch.bfloat16]


def memory_backend() -> str:
    """ "ucp" when the board's libhbucp allocator is in use, else "host"."""
    return _C._memory_backend()


# --- streams and events -------------------------------------------------------------------


def Stream(device: Any = None, priority: int = 0) -> torch.Stream:  # noqa: N802 - class-like
    """A new flagos stream with its own id."""
    return torch.Stream(torch.device(DEVICE_TYPE, _index(device)), priority=priority)


def Event(enable_timing: bool = True, **kwargs: Any) -> torch.Event:  # noqa: N802
    """An event with a real host timestamp; `start.elapsed_time(end)` is in milliseconds."""
    return torch.Event(DEVICE_TYPE, enable_timing=enable_timing, **kwargs)


def current_stream(device: Any = None) -> torch.Stream:
    return torch.accelerator.current_stream(torch.device(DEVICE_TYPE, _index(device)))


def default_stream(device: Any = None) -> torch.Stream:
    return torch.Stream(stream_id=0, device_index=_index(device), device_type=_device_type_id())


def _device_type_id() -> int:
    return torch._C._autograd.DeviceType.PrivateUse1.value


def set_stream(s: torch.Stream) -> None:
    torch.accelerator.set_stream(s)


@contextlib.contextmanager
def stream(s: torch.Stream | None) -> Iterator[None]:
    """Make `s` the current stream inside the block."""
    if s is None:
        yield
        return
    prev = current_stream(s.device_index)
    set_stream(s)
    try:
        yield
    finally:
        set_stream(prev)


# --- random numbers -----------------------------------------------------------------------


def _generator(dev: Any = None) -> torch.Generator:
    return _C._default_generator(_index(dev))


def manual_seed(seed: int) -> None:
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for idx in range(device_count()):
        _C._default_generator(idx).manual_seed(int(seed))


def seed() -> int:
    return _generator().seed()


def initial_seed() -> int:
    return _generator().initial_seed()


def get_rng_state(device: Any = None) -> torch.Tensor:
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = None) -> None:
    _generator(device).set_state(new_state)


# --- memory -------------------------------------------------------------------------------


def memory_stats(device: Any = None) -> dict[str, int]:
    _index(device)
    return dict(_C._memory_stats())


def memory_allocated(device: Any = None) -> int:
    return memory_stats(device)["allocated_bytes"]


def max_memory_allocated(device: Any = None) -> int:
    return memory_stats(device)["max_allocated_bytes"]


def memory_reserved(device: Any = None) -> int:
    return memory_stats(device)["reserved_bytes"]


def max_memory_reserved(device: Any = None) -> int:
    return memory_stats(device)["max_reserved_bytes"]


def reset_peak_memory_stats(device: Any = None) -> None:
    _index(device)
    _C._reset_peak_memory_stats()


def empty_cache() -> None:
    """Return cached device blocks to the runtime (UCP or host)."""
    _C._empty_cache()

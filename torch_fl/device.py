"""`torch.flagos`: the Python device module of the flagos (RDK BPU) device.

PyTorch finds device-specific helpers (RNG state, streams, memory stats, AMP dtypes) through the
module registered for the backend's name, the way `torch.cuda` serves CUDA. Everything here is a
thin layer over `torch_fl._C` or over PyTorch's generic `torch.Stream` / `torch.Event`, which
reach the C++ device guard (csrc/runtime/device_guard.cpp).

`torch.flagos` itself is a clean module built by `as_torch_module()`: the public names in
`__all__` plus the few private hooks PyTorch looks up by name (`_lazy_init`, `_is_in_bad_fork`,
`_get_generator`), so no helper or import of this file shows up as a `torch.flagos` attribute.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import torch

# Names from the extension itself, not `from torch_fl import _C`: torch_fl/__init__.py imports
# this module, so reading the package's namespace here would tie the two in a cycle.
from torch_fl._C import (
    _current_device,
    _default_generator,
    _device_count,
    _empty_cache,
    _memory_backend,
    _page_size,
    _set_device,
    _ucp_library,
)

DEVICE_TYPE = "flagos"

__all__ = [
    "DeviceProperties",
    "Event",
    "Stream",
    "StreamContext",
    "current_device",
    "current_stream",
    "default_stream",
    "device",
    "device_count",
    "empty_cache",
    "get_amp_supported_dtype",
    "get_device_name",
    "get_device_properties",
    "get_rng_state",
    "initial_seed",
    "is_available",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_backend",
    "memory_reserved",
    "memory_stats",
    "memory_summary",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_device",
    "set_rng_state",
    "set_stream",
    "stream",
    "synchronize",
]


def _index(dev: Any = None) -> int:
    """Device index of `dev` (None, int, str or torch.device); flagos only, and in range."""
    if dev is None:
        return _current_device()
    if isinstance(dev, bool) or not isinstance(dev, (int, str, torch.device)):
        raise TypeError(
            f"expected a flagos device (an index, 'flagos:0' or a torch.device), got {dev!r}"
        )
    if isinstance(dev, int):
        idx = dev
    else:
        d = torch.device(dev)
        if d.type != DEVICE_TYPE:
            raise ValueError(f"expected a flagos device, got {d}; use 'flagos' or 'flagos:0'")
        idx = _current_device() if d.index is None else d.index
    if not 0 <= idx < _device_count():
        raise ValueError(
            f"flagos device index {idx} is out of range: this board exposes "
            f"{_device_count()} flagos device(s); use 'flagos' or 'flagos:0'"
        )
    return idx


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
    return _device_count()


def current_device() -> int:
    return _current_device()


def set_device(dev: Any) -> None:
    _set_device(_index(dev))


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
    return _memory_backend()


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


class StreamContext:
    """Context manager that makes `stream` current inside the block (`None`: no change)."""

    def __init__(self, stream: torch.Stream | None) -> None:
        if stream is not None and not isinstance(stream, torch.Stream):
            raise TypeError(f"expected a torch.Stream or None, got {type(stream).__name__}")
        if stream is not None and stream.device_type != _device_type_id():
            raise ValueError(f"expected a flagos stream, got a stream on {stream.device}")
        self.stream = stream
        self.prev: torch.Stream | None = None

    def __enter__(self) -> torch.Stream | None:
        if self.stream is not None:
            self.prev = current_stream(self.stream.device_index)
            set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc: object) -> None:
        if self.prev is not None:
            set_stream(self.prev)
            self.prev = None


def stream(s: torch.Stream | None) -> StreamContext:
    """Make `s` the current stream inside the block."""
    return StreamContext(s)


# --- random numbers -----------------------------------------------------------------------


def _generator(dev: Any = None) -> torch.Generator:
    return _default_generator(_index(dev))


def manual_seed(seed: int) -> None:
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for idx in range(device_count()):
        _default_generator(idx).manual_seed(int(seed))


def seed() -> int:
    return _generator().seed()


def seed_all() -> None:
    """Seed every flagos device with one fresh non-deterministic seed."""
    fresh = _generator(0).seed()
    for idx in range(1, device_count()):
        _default_generator(idx).manual_seed(fresh)


def _get_generator(device: torch.device) -> torch.Generator:
    """The default generator of `device` (PyTorch's AOT autograd looks this hook up by name)."""
    return _generator(device)


def initial_seed() -> int:
    return _generator().initial_seed()


def get_rng_state(device: Any = None) -> torch.Tensor:
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = None) -> None:
    _generator(device).set_state(new_state)


# --- memory -------------------------------------------------------------------------------
# The allocator is a c10::DeviceAllocator, so these are PyTorch's device-generic calls: the
# same numbers and keys as torch.cuda.memory_stats() ("allocated_bytes.all.current", ...).


def _torch_device(dev: Any) -> torch.device:
    return torch.device(DEVICE_TYPE, _index(dev))


def memory_stats(device: Any = None) -> dict[str, Any]:
    return dict(torch.accelerator.memory_stats(_torch_device(device)))


def memory_allocated(device: Any = None) -> int:
    return torch.accelerator.memory_allocated(_torch_device(device))


def max_memory_allocated(device: Any = None) -> int:
    return torch.accelerator.max_memory_allocated(_torch_device(device))


def memory_reserved(device: Any = None) -> int:
    return torch.accelerator.memory_reserved(_torch_device(device))


def max_memory_reserved(device: Any = None) -> int:
    return torch.accelerator.max_memory_reserved(_torch_device(device))


def reset_peak_memory_stats(device: Any = None) -> None:
    torch.accelerator.reset_peak_memory_stats(_torch_device(device))


def reset_accumulated_memory_stats(device: Any = None) -> None:
    torch.accelerator.reset_accumulated_memory_stats(_torch_device(device))


def empty_cache() -> None:
    """Return cached device blocks to the runtime (UCP or host)."""
    _empty_cache()


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes. Device memory is carved from the machine's RAM (UCP or host), and
    the UCP runtime has no heap query, so these are the RAM's available and total bytes."""
    free, total = torch.accelerator.get_memory_info(_torch_device(device))
    return int(free), int(total)


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A readable table of the allocator's statistics (current, peak, total allocated/freed)."""
    dev = _torch_device(device)
    stats = memory_stats(dev)
    rows = [("allocated_bytes", "Allocated memory"), ("reserved_bytes", "Reserved memory")]
    if not abbreviated:
        rows += [("allocation", "Allocations"), ("segment", "Device blocks")]
    lines = [
        f"flagos memory summary, device {dev.index} ({memory_backend()} memory)",
        f"{'':24}{'current':>16}{'peak':>16}{'total alloc':>16}{'total freed':>16}",
    ]
    for key, title in rows:
        values = [stats.get(f"{key}.all.{field}", 0) for field in _SUMMARY_FIELDS]
        if key.endswith("bytes"):
            cells = [_format_bytes(v) for v in values]
        else:
            cells = [str(v) for v in values]
        lines.append(f"{title:24}" + "".join(f"{c:>16}" for c in cells))
    lines.append(
        f"device allocations {stats.get('num_device_alloc', 0)}, "
        f"frees {stats.get('num_device_free', 0)}, "
        f"out-of-memory errors {stats.get('num_ooms', 0)}"
    )
    return "\n".join(lines) + "\n"


_SUMMARY_FIELDS = ("current", "peak", "allocated", "freed")


def _format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


# --- device properties --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    """What `get_device_properties` reports for a flagos device."""

    name: str
    index: int
    total_memory: int  # bytes of the memory flagos tensors are carved from
    memory_backend: str  # "ucp" (the board's BPU-visible memory) or "host"
    ucp_library: str | None
    page_size: int


def get_device_name(device: Any = None) -> str:
    """ "RDK BPU (UCP memory)" on a board with the runtime, else "RDK BPU (host memory)"."""
    _index(device)
    return f"RDK BPU ({'UCP' if memory_backend() == 'ucp' else 'host'} memory)"


def get_device_properties(device: Any = None) -> DeviceProperties:
    idx = _index(device)
    return DeviceProperties(
        name=get_device_name(idx),
        index=idx,
        total_memory=mem_get_info(idx)[1],
        memory_backend=memory_backend(),
        ucp_library=_ucp_library() or None,
        page_size=_page_size(),
    )


# --- torch.flagos ---------------------------------------------------------------------------

# Private names PyTorch's generic code looks up on a device module.
_TORCH_HOOKS = ("_lazy_init", "_is_in_bad_fork", "_get_generator")


def as_torch_module() -> types.ModuleType:
    """The module registered as `torch.flagos`: this module's public API and PyTorch's hooks."""
    module = types.ModuleType(f"torch.{DEVICE_TYPE}", __doc__)
    for name in (*__all__, *_TORCH_HOOKS):
        setattr(module, name, globals()[name])
    module.__all__ = list(__all__)
    return module

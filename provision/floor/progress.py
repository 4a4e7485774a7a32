"""Progress lines for long work: torch_fl/_progress.py's heartbeat, loaded without importing torch.

The matrix runner, the build and provisioning must show that a twenty-minute step is alive
before torch or the extension exist, so the heartbeat is one of the standard-library-only files
that light.py loads by path (the same module object torch_fl uses, once torch_fl is imported).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from provision.floor import light


def load() -> ModuleType:
    """The heartbeat module (torch_fl/_progress.py)."""
    return light.load("_progress")


def heartbeat(label: str, **kwargs: Any) -> Any:
    """A `Heartbeat` (torch_fl/_progress.py): use it as a context manager."""
    return load().Heartbeat(label, **kwargs)

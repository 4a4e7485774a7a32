"""The harness's handle on torch_fl/_progress.py (the heartbeat), loaded without importing torch.

`import torch_fl` imports torch and the C++ extension; the matrix runner and provisioning must
work (and print progress) before either exists, so the module is loaded from its file. When
torch_fl is already imported its own module is used, so a process holds one copy.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

_PROGRESS_FILE = Path(__file__).resolve().parents[1] / "torch_fl" / "_progress.py"
_ALIAS = "_torch_fl_light._progress"


def load() -> ModuleType:
    """The heartbeat module."""
    for name in ("torch_fl._progress", _ALIAS):
        if name in sys.modules:
            return sys.modules[name]
    spec = importlib.util.spec_from_file_location(_ALIAS, _PROGRESS_FILE)
    assert spec is not None and spec.loader is not None, _PROGRESS_FILE
    module = importlib.util.module_from_spec(spec)
    sys.modules[_ALIAS] = module
    spec.loader.exec_module(module)
    return module


def heartbeat(label: str, **kwargs: Any) -> Any:
    """A `Heartbeat` (torch_fl/_progress.py): use it as a context manager."""
    return load().Heartbeat(label, **kwargs)

"""torch_fl's standard-library-only modules, for tooling that runs before torch_fl can import.

Provisioning, the build and the lab run where torch or the compiled extension may not exist yet,
and `import torch_fl.targets` would first execute torch_fl/__init__.py, which imports both. The
modules named in `LIGHT` import nothing but the standard library, so they are loaded straight
from their files. When torch_fl is already imported its own module object is used, so a process
never holds two copies of a fact.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType


def _package_dir() -> Path:
    """This checkout's torch_fl/, else the installed package's directory (found without
    importing it): a board's lanes run from a checkout shipped without torch_fl/, beside the
    library its provisioning installed (docs/farm.md)."""
    beside = Path(__file__).resolve().parents[2] / "torch_fl"
    if beside.is_dir():
        return beside
    spec = importlib.util.find_spec("torch_fl")
    if spec is not None and spec.origin:
        return Path(spec.origin).parent
    return beside  # neither: path_of names the missing file when it is loaded


PACKAGE_DIR = _package_dir()
LIGHT = (
    "targets",
    "unity_build",
    "atomic",
    "envfile",
    "_progress",
    "bpu.drivers.hbdk4_guest",
    "bpu.cache_listing",
)
_LOCK = threading.Lock()  # provisioning runs hosts in threads: nobody sees a half-run module


def path_of(name: str) -> Path:
    """The file of torch_fl.<name> (one of LIGHT); hbdk4_guest is also shipped to targets."""
    if name not in LIGHT:
        raise ValueError(f"torch_fl.{name} is not a standard-library-only module ({LIGHT})")
    return PACKAGE_DIR.joinpath(*name.split(".")).with_suffix(".py")


def load(name: str) -> ModuleType:
    """torch_fl.<name> (one of LIGHT) without executing torch_fl/__init__.py."""
    path = path_of(name)
    real = sys.modules.get(f"torch_fl.{name}")
    if real is not None:
        return real
    alias = f"_torch_fl_light.{name}"
    with _LOCK:
        if alias not in sys.modules:
            _exec(alias, path)
    return sys.modules[alias]


def _exec(alias: str, path: Path) -> None:
    spec = importlib.util.spec_from_file_location(alias, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[alias] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[alias]
        raise

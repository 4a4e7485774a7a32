"""What the compiler's Python (x86_64, often under box64) needs before `import hbdk4.compiler`.

Standalone on purpose, standard library only: it runs in that interpreter, where torch_fl and
torch are not installed. Both users share it: the compile worker (hbdk4_worker.py, its
neighbour) and provisioning, which installs it into the provisioned interpreter and proves the
import with `python hbdk4_guest.py check EMULATED GUEST_LIBS` (prints `TFL_HBDK4 <version>`).

- Import shims (emulated only): hbdk4 imports numba and torch at module scope. Real numba's JIT
  (llvmlite) segfaults under box64 and standard ONNX graphs never call it; torch is used for
  isinstance checks only and would cost hundreds of MB. The shims import, and raise only when
  something is really called.
- libhbtl preload: hbdk4's _hbdk*.so uses libhbtl symbols without listing the library as a
  dependency, so it is loaded with RTLD_GLOBAL first.
"""

import ctypes
import glob
import importlib.util
import os
import sys
import types

SHIMMED = ("numba", "llvmlite", "torch")
SHIM_VERSION = "0.0.0+torch-fl-shim"


class _Unavailable:
    """Import-only shim: attribute access works, calling raises."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Unavailable(f"{self._name}.{item}")

    def __call__(self, *args, **kwargs):
        # `@numba.njit` / `@numba.jit(...)` at import time: hand back a function that raises
        # only if it is ever called (standard ONNX graphs never call it).
        if len(args) == 1 and callable(args[0]) and not kwargs:
            name = self._name

            def unavailable(*a, **k):
                raise RuntimeError(f"{name} is not available in the emulated compiler")

            return unavailable
        return _Unavailable(f"{self._name}()")

    def __mro_entries__(self, bases):
        return (object,)


def _shim_module(name):
    module = types.ModuleType(name)
    module.__path__ = []
    module.__getattr__ = (
        lambda item: (  # type: ignore[method-assign]
            type(item, (), {}) if item[:1].isupper() else _Unavailable(f"{name}.{item}")
        )
    )
    module.__version__ = SHIM_VERSION
    return module


class ShimFinder:
    """Serve numba/llvmlite/torch and their submodules as shims."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in SHIMMED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return _shim_module(spec.name)

    def exec_module(self, module):
        return None


def install_shims():
    """Put the shims ahead of every other importer (once per interpreter)."""
    if not any(isinstance(finder, ShimFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, ShimFinder())


def preload_hbtl(guest_libs):
    """Load the first libhbtl found in GUEST_LIBS dirs, then in the hbdk4 package; its path."""
    candidates = []
    for directory in filter(None, (guest_libs or "").split(os.pathsep)):
        candidates += sorted(glob.glob(os.path.join(directory, "libhbtl*.so*")))
    spec = importlib.util.find_spec("hbdk4")
    if spec is not None and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            pattern = os.path.join(root, "**", "libhbtl*.so*")
            candidates += sorted(glob.glob(pattern, recursive=True))
    for path in candidates:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        return path
    return None


def check(emulated, guest_libs):
    """Prepare like the worker, import hbdk4.compiler, print its version."""
    if emulated:
        install_shims()
    preload_hbtl(guest_libs)
    import hbdk4
    import hbdk4.compiler

    version = getattr(hbdk4.compiler, "__version__", getattr(hbdk4, "__version__", "?"))
    print("TFL_HBDK4", version)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "check" or sys.argv[2] not in ("0", "1"):
        sys.exit("usage: hbdk4_guest.py check EMULATED(0|1) GUEST_LIBS")
    check(sys.argv[2] == "1", sys.argv[3])

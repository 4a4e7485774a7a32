"""Runs inside the compiler's Python (native x86_64 or x86_64 under box64). Standalone on purpose.

It must not import torch_fl or torch: under emulation every import costs seconds and real torch
is not installed there. Usage:
  python hbdk4_worker.py IN.onnx OUT.hbm MARCH OPT_LEVEL EMULATED(0|1) GUEST_LIBS RESULT.json
Steps, each reported by name on failure: shims (emulated only), preload, import, export,
convert, compile. The last line of work is writing RESULT.json.
"""

import ctypes
import glob
import importlib.util
import json
import os
import sys
import traceback
import types

# hbdk4's compile() reloads the finished .hbm to validate it, which claims BPU memory and can fail
# under emulation after a complete artifact was written. Only failures whose traceback or message
# carries one of these markers, with a non-empty output file, are tolerated.
VALIDATION_MARKERS = ("validat", "reload", "hbrt", "load model", "bpu memory")


class _Unavailable:
    """Import-only shim: attribute access works, calling raises (see module doc of shims)."""

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
    module.__version__ = "0.0.0+torch-fl-shim"
    return module


class _ShimFinder:
    """Serve numba/llvmlite/torch (and submodules) as shims: real numba's JIT segfaults under
    box64 and real torch would cost hundreds of MB for isinstance checks only."""

    ROOTS = ("numba", "llvmlite", "torch")

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.ROOTS:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return _shim_module(spec.name)

    def exec_module(self, module):
        return None


def _preload_hbtl(guest_libs):
    candidates = []
    for directory in filter(None, (guest_libs or "").split(os.pathsep)):
        candidates += sorted(glob.glob(os.path.join(directory, "libhbtl.so*")))
    spec = importlib.util.find_spec("hbdk4")
    if spec is not None and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            candidates += sorted(glob.glob(os.path.join(root, "**", "libhbtl.so*"), recursive=True))
    for path in candidates:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        return path
    return None


def main(argv):
    src, out, march, opt, emulated, guest_libs, result_path = argv[1:8]
    result = {"ok": False, "stage": "start"}

    def finish(**fields):
        result.update(fields)
        tmp = result_path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(result, fh)
        os.replace(tmp, result_path)

    try:
        if emulated == "1":
            result["stage"] = "shims"
            sys.meta_path.insert(0, _ShimFinder())
        result["stage"] = "preload"
        result["preloaded"] = _preload_hbtl(guest_libs)
        result["stage"] = "import"
        import hbdk4.compiler as compiler
        import hbdk4.compiler.onnx as hbonnx
        import onnx

        result["version"] = getattr(compiler, "__version__", None)
        result["stage"] = "export"
        module = hbonnx.export(onnx.load(src))
        result["stage"] = "convert"
        module = compiler.convert(module, march)
        result["stage"] = "compile"
        try:
            compiler.compile(module, out, march, opt=int(opt))
        except Exception as exc:
            text = (str(exc) + "".join(traceback.format_tb(exc.__traceback__))).lower()
            complete = os.path.exists(out) and os.path.getsize(out) > 0
            if complete and any(marker in text for marker in VALIDATION_MARKERS):
                return finish(ok=True, tolerated=f"{type(exc).__name__}: {exc}")
            raise
        if not (os.path.exists(out) and os.path.getsize(out) > 0):
            return finish(error="compile() returned but wrote no artifact")
        finish(ok=True)
    except BaseException as exc:  # report every failure to the parent, then exit non-zero
        tb = traceback.format_exc()
        finish(error=f"{type(exc).__name__}: {exc}", traceback=tb[-4000:])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

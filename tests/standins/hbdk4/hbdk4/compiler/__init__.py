"""Stand-in for hbdk4.compiler (tests only)."""

import ctypes
import json
import os
import time

MODE = os.environ.get("HBDK4_STANDIN_FAIL", "")
__version__ = "4.0.0+standin"

if MODE == "import":
    raise ImportError("hbdk4 stand-in: simulated import failure (broken wheel)")

_symbol = os.environ.get("HBDK4_STANDIN_LIBHBTL_SYMBOL")
if MODE == "symbol":
    _symbol = "hbtl_standin_missing_symbol"  # a libhbtl that lacks what _hbdk.so needs
if _symbol:
    try:
        getattr(ctypes.CDLL(None), _symbol)
    except AttributeError:
        raise ImportError(f"_hbdk.so: undefined symbol: {_symbol}") from None

# The real package imports numba and torch at module scope.
try:
    import numba  # noqa: F401

    _numba = getattr(numba, "__version__", "?")
except ImportError:
    _numba = None
try:
    import torch  # noqa: F401

    _torch = getattr(torch, "__version__", "?")
except ImportError:
    _torch = None

_record = os.environ.get("HBDK4_STANDIN_RECORD")
if _record:
    with open(_record, "w") as fh:
        json.dump(
            {
                "numba": _numba,
                "torch": _torch,
                "pythonpath_seen": os.environ.get("STANDIN_OUTER_PYTHONPATH", "<unset>"),
                "box64_ld_library_path": os.environ.get("BOX64_LD_LIBRARY_PATH"),
            },
            fh,
        )


class Module:
    def __init__(self, onnx_bytes, march=None):
        self.onnx_bytes = onnx_bytes
        self.march = march


def convert(module, march, advice=False):
    return Module(module.onnx_bytes, march)


def _validate(path):
    if MODE == "validate":
        raise RuntimeError("hbrt: failed to load model for validation: cannot allocate BPU memory")


def compile(module, path, march, opt=2):
    if MODE == "compile":
        raise RuntimeError("hbdk4 stand-in: lowering failed for op Conv (simulated)")
    if MODE == "timeout":
        while True:
            time.sleep(1)
    header = json.dumps({"march": march, "opt": opt, "compiler": __version__}, sort_keys=True)
    with open(path, "wb") as fh:
        fh.write(b"HBM-STANDIN\n" + header.encode() + b"\n" + module.onnx_bytes)
    _validate(path)
    return path

"""Runs inside the compiler's Python (native x86_64 or x86_64 under box64). Standalone on purpose.

It must not import torch_fl or torch: under emulation every import costs seconds and real torch
is not installed there. Usage:
  python hbdk4_worker.py IN.onnx OUT.hbm MARCH OPT_LEVEL EMULATED(0|1) GUEST_LIBS RESULT.json
Steps, each reported by name on failure: shims (emulated only), preload, import, export,
convert, compile; the shims and the libhbtl preload live in hbdk4_guest.py (why: see there).
The last line of work is writing RESULT.json.
"""

import json
import os
import sys
import traceback

# The neighbouring file (this script's directory is sys.path[0]); shared with provisioning.
from hbdk4_guest import install_shims, preload_hbtl

# hbdk4's compile() reloads the finished .hbm to validate it, which claims BPU memory and can fail
# under emulation after a complete artifact was written. Only failures whose traceback or message
# carries one of these markers, with a non-empty output file, are tolerated.
VALIDATION_MARKERS = ("validat", "reload", "hbrt", "load model", "bpu memory")


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
            install_shims()
        result["stage"] = "preload"
        result["preloaded"] = preload_hbtl(guest_libs)
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

"""Run one hbdk4 compile in a child process (native or under box64) with a timeout.

A child process for the native case too: a hung compiler can be killed, a crashing one cannot
take the user's process down, and the emulated path is the same code plus an emulator prefix.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from torch_fl._progress import Heartbeat
from torch_fl.bpu.drivers.discovery import CompilerInfo, clean_env
from torch_fl.bpu.errors import CompileError

WORKER = Path(__file__).with_name("hbdk4_worker.py")
WATCHDOG = Path(__file__).with_name("watchdog.py")
WORK_PREFIX = "torch-fl-hbdk4-"
OWNER_FILE = "owner.pid"

_FIXES = {
    "shims": "report this: the import shims for numba/torch failed to install",
    "preload": "point FLAGOS_BPU_GUEST_LIBS at the directory holding the x86_64 libhbtl.so",
    "import": "check that FLAGOS_BPU_X86_PYTHON has the OE hbdk4 wheels and that "
    "FLAGOS_BPU_GUEST_LIBS holds libhbtl.so (its symbols must be preloaded)",
    "export": "the ONNX model uses an op hbdk4 cannot import; run with executor='eager'",
    "convert": "hbdk4 could not convert the graph for this march; check FLAGOS_BPU_MARCH",
    "compile": "hbdk4 failed to compile; see the message, or run with executor='sim'",
}


def compile_onnx(
    onnx_bytes: bytes, info: CompilerInfo, march: str, opt_level: int, timeout_s: float
) -> tuple[bytes, dict]:
    """Compile a (quantized) ONNX model to .hbm bytes; returns (hbm, worker result)."""
    if info.kind == "none" or not info.python:
        raise CompileError(f"no hbdk4 compiler: {info.detail}")
    emulated = info.kind == "emulated"
    _remove_orphaned_work_dirs()
    tmp = tempfile.mkdtemp(prefix=WORK_PREFIX)
    try:
        Path(tmp, OWNER_FILE).write_text(str(os.getpid()))
        src, out, res = (os.path.join(tmp, n) for n in ("in.onnx", "out.hbm", "result.json"))
        Path(src).write_bytes(onnx_bytes)
        cmd = [info.python, str(WORKER), src, out, march, str(opt_level)]
        cmd += ["1" if emulated else "0", info.guest_libs or "", res]
        if emulated and info.emulator:
            cmd.insert(0, info.emulator)
        python = info.python if info.python != sys.executable else sys.executable
        env = clean_env(info.guest_libs, emulated)
        env["PATH"] = os.path.dirname(python) + os.pathsep + env["PATH"]
        log_path = Path(tmp, "worker.log")
        with open(log_path, "wb") as log:
            # The watchdog (host Python, standard library only) runs the compiler in a group of
            # its own and kills that group when our end of its stdin closes: on any exit of
            # this process, kill -9 included. See watchdog.py.
            proc = subprocess.Popen(
                [sys.executable, "-I", str(WATCHDOG), tmp, "--", *cmd],
                env=env,
                cwd=tmp,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a terminal's Ctrl-C reaches us, not the compiler
            )
        try:
            # An emulated compile can take many minutes: say it is alive, on stderr (one line
            # per ~30 s in a log, a live line on a terminal).
            with Heartbeat(f"hbdk4 compile ({info.kind}, {march})"):
                proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc)
            raise CompileError(
                f"hbdk4 compile timed out after {timeout_s:g}s ({info.kind}). Fix: raise "
                "FLAGOS_BPU_COMPILE_TIMEOUT (emulated ResNet-18 takes ~25 min) or compile on an "
                "x86_64 host with `invoke compile-host` and ship the cache."
            ) from None
        except BaseException:  # KeyboardInterrupt, SystemExit from a signal handler, ...
            _stop(proc)
            raise
        finally:
            if proc.stdin is not None:
                proc.stdin.close()
        output = log_path.read_bytes()
        try:
            result = json.loads(Path(res).read_text())
        except (OSError, ValueError):
            tail = output.decode(errors="replace")[-1500:]
            raise CompileError(
                f"hbdk4 worker exited with {proc.returncode} without a result ({info.kind}); "
                f"output tail:\n{tail}"
            ) from None
        if not result.get("ok"):
            stage = result.get("stage", "?")
            raise CompileError(
                f"hbdk4 failed at stage {stage!r} ({info.kind}, {info.python}): "
                f"{result.get('error')}. Fix: {_FIXES.get(stage, 'see the message')}."
            )
        return Path(out).read_bytes(), result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _stop(proc: subprocess.Popen) -> None:
    """End a compile we gave up on: EOF makes the watchdog kill the compiler's group."""
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the watchdog itself hangs: no cleanup left to do
        proc.wait()


def _remove_orphaned_work_dirs() -> None:
    """Work directories whose owner died without cleaning up (the watchdog itself was killed)."""
    for path in Path(tempfile.gettempdir()).glob(f"{WORK_PREFIX}*"):
        try:
            owner = int(Path(path, OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not ours, or still being created
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:
            pass  # alive, another user's

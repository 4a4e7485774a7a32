"""The repository root, stand-in builds, fresh interpreters: shared by every lane."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # tests/support/ -> the repository
STANDINS = ROOT / "tests" / "standins"


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str


# qemu's `virt` machine, the lab's emulated board, names itself in the device tree; no board does.
QEMU_VIRT_DT = Path("/sys/firmware/devicetree/base/compatible")
EMULATOR_SIGILL_RETRIES = 1
"""Runs more of a process that qemu's TCG killed with SIGILL on the emulated board. The lab's
qemu (Debian's 7.2) has killed a fresh process there with SIGILL now and then, each time at a
different place and never twice in a row: pip's build backend at its start (the torch_fl wheel
build), and the second of two identical `torch.compile` interpreters of the exit lane (CI, the
first passed). A real illegal instruction is deterministic, happens again, and still fails;
anywhere else than on qemu's virt machine a SIGILL is never run again."""


class EmulatorSigill(UserWarning):
    """A process the emulated board's qemu killed with SIGILL, run once more (pytest lists it)."""


def on_qemu_virt(dt: Path = QEMU_VIRT_DT) -> bool:
    """Whether this machine is qemu's `virt` machine (its device tree is `linux,dummy-virt`)."""
    try:
        return b"linux,dummy-virt" in dt.read_bytes()
    except OSError:
        return False


def run_process(
    argv: Sequence[str],
    env: dict[str, str] | None = None,
    timeout: float = 120.0,
    cwd: Path | str | None = None,
    retries: int = EMULATOR_SIGILL_RETRIES,
    emulated: bool | None = None,
) -> subprocess.CompletedProcess:
    """`argv` to completion, output captured as text; a SIGILL on qemu's virt machine is run
    again up to `retries` times, with an `EmulatorSigill` warning each time (`emulated`: None
    detects it)."""
    emulated = on_qemu_virt() if emulated is None else emulated
    argv = list(argv)

    def once() -> subprocess.CompletedProcess:
        return subprocess.run(
            argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
        )

    proc = once()
    for attempt in range(1, retries + 1):
        if proc.returncode != -signal.SIGILL or not emulated:
            break
        warnings.warn(
            EmulatorSigill(
                f"{Path(argv[0]).name} was killed by SIGILL on qemu's virt machine (try "
                f"{attempt} of {retries + 1}); running it again. stderr: {proc.stderr[-300:]}"
            ),
            stacklevel=2,
        )
        proc = once()
    return proc


def run_python(
    code: str, env: dict[str, str] | None = None, timeout: float = 120.0, cwd: Path | None = None
) -> Completed:
    """Run `code` in a fresh interpreter (real process exit, real library teardown)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = run_process([sys.executable, "-c", code], full_env, timeout, str(cwd or ROOT))
    return Completed(proc.returncode, proc.stdout, proc.stderr)


def build_shared_library(source: Path, out_dir: Path, name: str, extra: list[str] = ()) -> Path:
    """Compile one C file into a shared library with the system compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler: install gcc to build the test stand-ins")
    target = out_dir / name
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-o", str(target), str(source), *extra, "-ldl"],
        check=True,
        capture_output=True,
    )
    return target


def wait_for_pid(path: Path, timeout: float) -> int:
    """The pid a child writes to `path`, once all its digits are there: the file exists from
    its open on and its text comes a moment later (a CI run read it empty)."""
    import time

    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text.strip().isdigit():
            return int(text)
        time.sleep(0.1)
    raise AssertionError(f"no pid in {path} after {timeout} s (text {text!r})")

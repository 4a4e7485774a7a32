"""tests/support/process.run_process: a SIGILL on qemu's virt machine is run once more, only there."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from tests.support.process import EmulatorSigill, on_qemu_virt, run_process

# Dies of SIGILL while the counter file holds fewer than `n` marks, one mark per run (no core
# file: a machine with core dumps on would otherwise write one per death).
SIGILL_FIRST_N = """
import os, resource, signal, sys
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
path, n = sys.argv[1], int(sys.argv[2])
with open(path, "a") as f:
    f.write("x")
if len(open(path).read()) <= n:
    os.kill(os.getpid(), signal.SIGILL)
print("survived")
"""


def _argv(tmp_path: Path, n: int) -> list[str]:
    return [sys.executable, "-c", SIGILL_FIRST_N, str(tmp_path / "runs"), str(n)]


def _runs(tmp_path: Path) -> int:
    return len((tmp_path / "runs").read_text())


def test_a_sigill_on_the_emulator_is_run_again_once(tmp_path: Path):
    with pytest.warns(
        EmulatorSigill, match=r"killed by SIGILL on qemu's virt machine \(try 1 of 2"
    ):
        proc = run_process(_argv(tmp_path, 1), cwd=tmp_path, emulated=True)
    assert (proc.returncode, proc.stdout.strip(), _runs(tmp_path)) == (0, "survived", 2)


def test_a_sigill_twice_on_the_emulator_fails(tmp_path: Path):
    with pytest.warns(EmulatorSigill):
        proc = run_process(_argv(tmp_path, 5), cwd=tmp_path, emulated=True)
    assert (proc.returncode, _runs(tmp_path)) == (-signal.SIGILL, 2)


def test_a_sigill_elsewhere_is_never_run_again(tmp_path: Path, recwarn: pytest.WarningsRecorder):
    proc = run_process(_argv(tmp_path, 1), cwd=tmp_path, emulated=False)
    assert (proc.returncode, _runs(tmp_path)) == (-signal.SIGILL, 1)
    assert not [w for w in recwarn if issubclass(w.category, EmulatorSigill)]


def test_other_failures_are_not_run_again(tmp_path: Path):
    proc = run_process([sys.executable, "-c", "import sys; sys.exit(3)"], emulated=True)
    assert proc.returncode == 3


def test_the_virt_machine_is_told_by_its_device_tree(tmp_path: Path):
    dt = tmp_path / "compatible"
    dt.write_bytes(b"linux,dummy-virt\0")
    assert on_qemu_virt(dt)
    dt.write_bytes(b"d-robotics,rdk-s100\0arm,cortex-a78ae\0")
    assert not on_qemu_virt(dt)
    assert not on_qemu_virt(tmp_path / "absent")

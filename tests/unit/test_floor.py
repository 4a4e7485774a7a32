"""The tooling's shared floor (provision/floor/): each fact it holds, exercised for real."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provision.floor import exitcodes, locks, procgroup, signals

REPO = Path(__file__).resolve().parents[2]


def test_exit_codes_are_what_shells_report() -> None:
    assert exitcodes.INTERRUPTED == 128 + signal.SIGINT == 130
    assert (exitcodes.OK, exitcodes.FAILED, exitcodes.USAGE) == (0, 1, 2)


def test_sigterm_becomes_an_interrupt_inside_the_block_only() -> None:
    before = signal.getsignal(signal.SIGTERM)
    seen: list[int] = []
    with pytest.raises(KeyboardInterrupt, match="signal 15"):
        with signals.as_interrupt((signal.SIGTERM,), on_signal=seen.append):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this ends
    assert seen == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is before


def test_kill_group_reaches_a_child_that_ignores_sigterm(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    script = (
        "import os, signal, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    started = time.monotonic()
    procgroup.kill_group(proc, grace_s=0.5)
    assert proc.poll() is not None and time.monotonic() - started < 10
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the grandchild {child} outlived its group")
    procgroup.kill_group(proc)  # already gone: no error


def test_a_held_lock_makes_the_second_holder_busy(tmp_path: Path) -> None:
    lock = tmp_path / "locks" / "x.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; sys.path.insert(0, sys.argv[2]); from pathlib import Path; "
         "from provision.floor import locks\n"
         "with locks.held(Path(sys.argv[1]), RuntimeError):\n"
         "    print('held', flush=True); time.sleep(60)", str(lock), str(REPO)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(LookupError, match="busy"):
            with locks.held(lock, lambda: LookupError("busy")):
                pass
    finally:
        holder.kill()
        holder.wait()
    with locks.held(lock, lambda: LookupError("busy")):  # its process ended: the lock with it
        pass


def test_light_loads_a_torch_fl_file_without_torch() -> None:
    code = (
        "import sys; from provision.floor import light; "
        "m = light.load('targets'); print(bool(m.MARCHES), 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.split() == ["True", "False"], out.stderr

"""scripts/quiet.py: a benchmark's wait until the process's other threads stop running, with a
real spinning thread standing for a thread pool's worker."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from scripts import quiet

ROOT = Path(__file__).resolve().parents[2]
linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/self/task/*/schedstat"
)


def _spin_for(seconds: float) -> threading.Thread:
    """A thread that keeps a CPU busy for `seconds`, as a pool worker spins after its work."""
    started = threading.Event()

    def spin() -> None:
        started.set()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    started.wait()
    return thread


@linux_only
def test_the_other_threads_cpu_time_grows_while_one_spins_and_leaves_out_the_callers() -> None:
    thread = _spin_for(1.0)
    before = quiet.other_threads_cpu_ns()
    time.sleep(0.03)
    after = quiet.other_threads_cpu_ns()
    alive = thread.is_alive()
    thread.join()
    assert alive
    assert before is not None and after is not None
    assert thread.native_id in after and threading.get_native_id() not in after
    assert after[thread.native_id] - before[thread.native_id] > 5e6  # > 5 ms of its 30


@linux_only
def test_settle_waits_until_a_spinning_thread_stops() -> None:
    thread = _spin_for(0.12)
    start = time.perf_counter()
    waited = quiet.settle(max_s=1.0)
    stopped = not thread.is_alive()
    thread.join()
    assert stopped, "settle returned while the other thread still ran"
    assert waited >= 0.1 and time.perf_counter() - start >= 0.1


@linux_only
def test_settle_on_a_quiet_process_returns_after_its_least_pause() -> None:
    """In a fresh process (this one may hold other tests' thread pools, still spinning)."""
    code = (
        "from scripts import quiet; "
        "w = [quiet.settle(0.02) for _ in range(3)]; print(max(w)); "
        "assert all(0.02 <= x < 0.02 + 0.1 for x in w), w"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]


@linux_only
def test_a_thread_that_never_sleeps_ends_the_wait_at_its_bound() -> None:
    thread = _spin_for(0.6)
    waited = quiet.settle(max_s=0.15)
    thread.join()
    assert 0.15 <= waited < 0.4


def test_where_threads_cannot_be_read_it_pauses_the_fallback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(quiet, "other_threads_cpu_ns", lambda: None)
    waited = quiet.settle()
    assert quiet.FALLBACK_S <= waited < quiet.FALLBACK_S + 0.1

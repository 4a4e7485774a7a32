"""Wait until this process's other threads stop running: the idle a benchmark leaves between
variants that each bring a thread pool.

A pool's threads keep a CPU busy after their last work item. ONNX Runtime's intra-op workers
spin before they sleep (`session.intra_op.allow_spinning`, on by default): after a 2-thread
MobileNetV3 session stopped, its worker ran 34 to 43 ms more (three repeats on a 2-vCPU EPYC,
read from /proc/self/task/*/schedstat); torch's OpenMP workers 7 to 10 ms. A fixed 20 ms pause
therefore left the next variant sharing a 2-CPU host with the previous one's spinning worker for
another ~20 ms, and calls in that window took ~5 ms longer (a scheduler slice). How long a pool
spins depends on the runtime and the CPU, so the wait is measured, not assumed.
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["FALLBACK_S", "other_threads_cpu_ns", "settle"]

QUIET_WINDOW_S = 0.005
"""The other threads count as asleep once they ran less than `QUIET_SHARE` of a window this long."""
QUIET_SHARE = 0.05
MAX_WAIT_S = 0.25
"""At most this long in all: a thread that never sleeps (a user's own worker) must not hang the
benchmark; the wait then ends as a plain pause."""
FALLBACK_S = 0.06
"""Where the threads' CPU time cannot be read (not Linux): a pause longer than the spins measured
above."""


def other_threads_cpu_ns() -> dict[int, int] | None:
    """CPU nanoseconds run so far by each thread of this process but the caller's (Linux's
    per-thread schedstat), or None where that cannot be read."""
    me = threading.get_native_id()
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    ran: dict[int, int] = {}
    for name in tids:
        tid = int(name)
        if tid == me:
            continue
        try:
            with open(f"/proc/self/task/{name}/schedstat", "rb") as f:
                ran[tid] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread exited between the listing and the read
    return ran


def settle(min_s: float = 0.0, max_s: float = MAX_WAIT_S) -> float:
    """Sleep at least `min_s`, then until the process's other threads ran less than
    `QUIET_SHARE` of a `QUIET_WINDOW_S` window, `max_s` at most in all (`FALLBACK_S` where their
    CPU time cannot be read). Returns the seconds waited."""
    start = time.perf_counter()
    if min_s > 0:
        time.sleep(min_s)
    before = other_threads_cpu_ns()
    if before is None:
        time.sleep(max(FALLBACK_S - (time.perf_counter() - start), 0.0))
        return time.perf_counter() - start
    while time.perf_counter() - start < max_s:
        time.sleep(QUIET_WINDOW_S)
        after = other_threads_cpu_ns() or {}
        ran = sum(after[t] - before[t] for t in after.keys() & before.keys())
        if ran < QUIET_SHARE * QUIET_WINDOW_S * 1e9:
            break
        before = after
    return time.perf_counter() - start

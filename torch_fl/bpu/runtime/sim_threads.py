"""How many ONNX Runtime threads a sim partition runs on: measured on its first call, not assumed.

More intra-op threads are not always faster. On a 2-vCPU Xeon VM, ORT's own int8 session of a
4-layer transformer encoder took 14.9 ms at 1 thread and 33.7 ms at 2 (scripts/bench_sim.py); on
a small graph the pool's hand-offs cost more than the work they split. So with
`sim_thread_choice="measured"` (the default) a sim partition opens its session at each candidate
count (1, half and all of `sim_threads`; 0: every CPU this process may run on), runs each on the
partition's first inputs, interleaved so that a noisy neighbour slows all of them alike, and
keeps the one with the lowest median. A count that leaves no CPU free for the checker thread pays
the baked-weight check inside the call (conversion/freezing.py), so that check's own time is
added to its runs. `explain()` shows the choice and the times it rests on.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

ROUNDS = 3
"""Timed runs per candidate (after one untimed warm-up each)."""
PAUSE_S = 0.02
"""Idle time before each timed run. A call after a pause finds ORT's pool threads asleep (they
spin only briefly after a run) and pays their wake-up; back-to-back runs do not, and on a 2-vCPU
VM they made 2 threads look faster while every single call was slower. The pause times what a
caller sees when its calls have gaps (a camera loop, a request), as scripts/bench_sim.py does."""
BUDGET_S = 2.0
"""Measuring stops after the round in which this much time was spent (a slow partition gets
fewer rounds, never an unbounded first call)."""


@dataclass(frozen=True)
class ThreadChoice:
    """The count a sim partition runs on, and why."""

    threads: int
    """ORT intra-op threads (0: ORT's default, only with sim_thread_choice='fixed')."""
    reason: str
    times_ms: dict[int, float] | None = None
    """Median ms per call at each candidate count, the weight check included where it is paid
    inside the call (None: not measured)."""


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def candidates(cap: int, cpus: int) -> tuple[int, ...]:
    """1, half and all of `cap` threads (0: `cpus`), ascending and distinct."""
    most = max(cap or cpus, 1)
    return tuple(sorted({1, max(most // 2, 1), most}))


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def measure(
    runs: dict[int, Callable[[], object]],
    rounds: int = ROUNDS,
    budget_s: float = BUDGET_S,
    pause_s: float = PAUSE_S,
) -> dict[int, float]:
    """Median seconds of each callable: one warm-up each, then rounds of one run each in turn,
    each after `pause_s` idle."""
    for run in runs.values():
        run()
    samples: dict[int, list[float]] = {n: [] for n in runs}
    start = time.perf_counter()
    for _ in range(rounds):
        for n, run in runs.items():
            if pause_s:
                time.sleep(pause_s)
            t0 = time.perf_counter()
            run()
            samples[n].append(time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s:
            break
    return {n: _median(s) for n, s in samples.items()}


def choose(
    session_s: dict[int, float], check_s: float, check_beside: Callable[[int], bool]
) -> ThreadChoice:
    """The fastest count: its session's median, plus `check_s` where `check_beside(n)` is false
    (no CPU left for the checker thread: the check runs before the call)."""
    inside = {n for n in session_s if check_s and not check_beside(n)}
    total = {n: s + (check_s if n in inside else 0.0) for n, s in session_s.items()}
    best = min(total, key=lambda n: (total[n], n))
    times = {n: round(t * 1e3, 3) for n, t in sorted(total.items())}
    shown = ", ".join(f"{n} thread{'s' * (n > 1)} {t:g} ms" for n, t in times.items())
    checked = f"; the weight check included at {sorted(inside)}" if inside else ""
    return ThreadChoice(best, f"measured on the first call: {shown}{checked}", times)

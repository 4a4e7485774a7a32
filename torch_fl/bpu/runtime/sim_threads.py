"""How many ONNX Runtime threads a sim partition runs on: measured on its first call, not assumed.

More intra-op threads are not always faster. On a 2-vCPU EPYC VM, ORT's own int8 session of a
4-layer transformer encoder took 11.89 ms at 1 thread and 21.05 ms at 2 (the AVX2 run of
scripts/bench_sim.py in docs/compile-models.md); on a small graph the pool's hand-offs cost more
than the work they split. So with
`sim_thread_choice="measured"` (the default) a sim partition opens its session at each candidate
count (1, half and all of `sim_threads`; 0: every CPU this process may run on), runs each on the
partition's first inputs, interleaved so that a noisy neighbour slows all of them alike, and
keeps the one with the lowest median. A count that leaves no CPU free for the checker thread pays
the baked-weight check inside the call (conversion/freezing.py), so that check's own time is
added to its runs. `explain()` shows the choice and the times it rests on.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from torch_fl.bpu.settings import usable_cpus

__all__ = [
    "CONFIRM_CALLS",
    "CONFIRM_MARGIN",
    "Confirmation",
    "ThreadChoice",
    "candidates",
    "choose",
    "measure",
    "usable_cpus",
]

ROUNDS = 7
"""Timed runs per candidate (after one untimed warm-up each), fewer where `BUDGET_S` runs out.
Three were too few on a noisy VM: ViT-S/16 at batch 1 once chose 1 thread on its first call
(1 thread 22.91 ms, 2 threads 25.97 ms), where the same sessions later in that process took
21.56 and 13.00 ms back to back; a median of three is lost to two slow rounds."""
PAUSE_S = 0.02
"""Idle time before each timed run: what a caller sees when its calls have short gaps (a camera
loop), not back to back. Back-to-back runs on a 2-vCPU VM made 2 threads look faster while
every single call was slower. A pool's workers stay awake through this pause: ORT's spin after a
run (its default `allow_spinning`), 34 to 43 ms on a 2-vCPU EPYC (scripts/quiet.py), so each
candidate's timed run finds its own workers spinning from its untimed one, as a loop's next
call does; calls spaced wider than that spin pay the workers' wake-up, which this choice does
not time."""
TURN_WARMUPS = 1
"""Untimed runs of a callable at the start of each of its turns, before the timed one. The first
run of an ONNX Runtime session right after another session ran is slow: its pool's threads wake
cold beside the other pool's. Two sessions of MobileNetV3-small (batch 8, 2 threads, 2-vCPU EPYC,
20 ms between calls) took 4.5 and 8.3 ms alone and 12.8 and 23.4 ms called in turn, and 4.6 and
8.0 ms in turn with one untimed run first. Without it, whichever candidate followed another
session was timed cold and lost; a caller running one model in a loop never sees that cost."""
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
    ranked: tuple[int, ...] = ()
    """The counts measured, fastest first by their unrounded times (`threads` first). Ranking
    `times_ms` instead, rounded to the microsecond, can put another count first on a near tie,
    and the confirmation's first block would then run a count explain() does not name."""


def candidates(cap: int, cpus: int) -> tuple[int, ...]:
    """1, half and all of `cap` threads (0: `cpus`), ascending and distinct."""
    most = max(cap or cpus, 1)
    return tuple(sorted({1, max(most // 2, 1), most}))


def measure(
    runs: dict[Hashable, Callable[[], object]],
    rounds: int = ROUNDS,
    budget_s: float = BUDGET_S,
    pause_s: float = PAUSE_S,
    warmups: int = 1,
    turn_warmups: int = TURN_WARMUPS,
    idle: Callable[[], object] | None = None,
) -> dict[Hashable, float]:
    """Median seconds of each callable: `warmups` untimed runs each, then rounds of one turn
    each in turn, each turn `turn_warmups` untimed runs and one timed run after `pause_s` idle
    (or after `idle()`, where given: scripts/bench_sim.py waits there until the other variants'
    pool threads sleep), until `rounds` or `budget_s` is spent."""
    for run in runs.values():
        for _ in range(warmups):
            run()
    samples: dict[Hashable, list[float]] = {n: [] for n in runs}
    start = time.perf_counter()
    for _ in range(rounds):
        for n, run in runs.items():
            for _ in range(turn_warmups if len(runs) > 1 else 0):
                run()
            if idle is not None:
                idle()
            elif pause_s:
                time.sleep(pause_s)
            t0 = time.perf_counter()
            run()
            samples[n].append(time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s:
            break
    return {n: statistics.median(s) for n, s in samples.items()}


def choose(
    session_s: dict[int, float], check_s: float, check_beside: Callable[[int], bool]
) -> ThreadChoice:
    """The fastest count: its session's median, plus `check_s` where `check_beside(n)` is false
    (no CPU left for the checker thread: the check runs before the call)."""
    inside = {n for n in session_s if check_s and not check_beside(n)}
    total = {n: s + (check_s if n in inside else 0.0) for n, s in session_s.items()}
    ranked = tuple(sorted(total, key=lambda n: (total[n], n)))
    best = ranked[0]
    times = {n: round(t * 1e3, 3) for n, t in sorted(total.items())}
    shown = ", ".join(f"{n} thread{'s' * (n > 1)} {t:g} ms" for n, t in times.items())
    checked = f"; the weight check included at {sorted(inside)}" if inside else ""
    return ThreadChoice(best, f"measured on the first call: {shown}{checked}", times, ranked)


CONFIRM_ROUNDS = 3
"""Rounds of the confirmation on later calls: each round a block of calls at each count."""
CONFIRM_BLOCK = 4
"""Calls per block of the confirmation, the first one untimed (it follows the other count's
session: see `TURN_WARMUPS`)."""
CONFIRM_MARGIN = 0.05
"""How much faster the confirmation must find another count before it overrides a first call
that told the two apart by more than this: within it, a confirmation that ran beside a busy
host cannot tell them apart. In a benchmark process on a 2-vCPU EPYC (scripts/bench_sim.py,
the 4-layer encoder at batch 1), the first call timed 1 thread 10.019 ms and 2 threads 5.437;
the confirmation, its calls among other programs' spinning pools, 8.911 and 9.035 ms, and the
fewer threads then won the near-tie: every later call ran 9.42 ms on 1 thread where 2 ran the
session in 5.5."""
CONFIRM_CALLS = CONFIRM_ROUNDS * 2 * CONFIRM_BLOCK
"""Calls a confirmation of two counts takes (the calls after a partition's first one)."""
PENDING = "; being confirmed on the next calls"
"""What explain() adds to a first call's choice while the confirmation runs."""


class Confirmation:
    """The first call's choice checked on the partition's next real calls.

    The first call measures the sessions alone, in whatever state the process is in right
    after a compile; on a busy host that can pick the wrong count: ViT-S/16 at batch 1 on a
    2-vCPU EPYC, in a benchmark process that had run other models, timed 1 thread 29.2 ms and 2
    threads 32.7 ms and kept 1; alone, the same first call timed 19.4 and 15.0 ms, and 2
    threads ran 15.3 ms a call against 20.3 for 1 (scripts/bench_sim.py, by hand). So the two
    fastest counts stay open, and the next `CONFIRM_CALLS` calls run in
    blocks at each in turn, timed whole (the weight check in or beside them, as each count
    runs it); the count with the lower median is kept. The integer kernels and the lookups give
    the same results at every count, so which one ran a call never shows in its outputs."""

    def __init__(
        self, counts: tuple[int, ...], pid: int, rounds: int = CONFIRM_ROUNDS,
        block: int = CONFIRM_BLOCK, first_ms: dict[int, float] | None = None,
    ) -> None:  # fmt: skip
        """`counts`: the first call's ranking, its choice first; `first_ms`: its times (ms a
        call) at each count, where it measured them."""
        self.counts = counts
        self.first_ms = dict(first_ms or {})
        self.pid = pid
        """The process it was set up in: a forked child has none of the open trial sessions."""
        self._plan = [
            (n, i > 0)  # (count, timed)
            for r in range(rounds)
            for n in (counts if r % 2 == 0 else counts[::-1])
            for i in range(block)
        ]
        self._next = 0
        self.samples: dict[int, list[float]] = {n: [] for n in counts}

    def next_count(self) -> int | None:
        """The count the next call runs on, or None once every block has run."""
        return self._plan[self._next][0] if self._next < len(self._plan) else None

    def record(self, seconds: float) -> None:
        """The call that `next_count` planned took `seconds`."""
        count, timed = self._plan[self._next]
        if timed:
            self.samples[count].append(seconds)
        self._next += 1

    def medians_ms(self) -> dict[int, float]:
        """Median ms of the timed calls at each count."""
        return {n: round(statistics.median(v) * 1e3, 3) for n, v in self.samples.items() if v}

    def best(self) -> int:
        """The count with the lowest median (the fewer threads on a tie), except where the first
        call's choice is within `CONFIRM_MARGIN` of it and the first call found that choice
        faster than every other count by more than the margin: then the first call's."""
        medians = self.medians_ms()
        fastest = min(medians, key=lambda n: (medians[n], n))
        first = self.counts[0] if self.counts else fastest
        if first == fastest or first not in medians:
            return fastest
        close = medians[first] <= medians[fastest] * (1 + CONFIRM_MARGIN)
        times = self.first_ms
        apart = first in times and all(
            times[first] * (1 + CONFIRM_MARGIN) < times[n] for n in self.counts[1:] if n in times
        )
        return first if close and apart else fastest

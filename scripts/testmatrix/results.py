"""What one lane's run produced (its buckets and problems) and where a lane's files go.

Buckets: passed, failed, expected-fail, unexpected-pass, skipped, infra-error. Infra errors
(collection error, worker crash, timeout, missing tool, stale expectation, pytest internal/usage
error) are kept apart from test outcomes: a lane that never ran its tests must not look green, and
a broken machine must not look like a broken test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from provision.floor import exitcodes

BUCKETS = ("passed", "failed", "expected-fail", "unexpected-pass", "skipped", "infra-error")
BAD_BUCKETS = ("failed", "unexpected-pass", "infra-error")
INTERRUPTED = exitcodes.INTERRUPTED  # the exit code of a run a Ctrl-C/SIGTERM cut short


@dataclass
class LaneResult:
    name: str
    status: str  # "ran" | "not-run" | "interrupted"
    missing: list[str] = field(default_factory=list)
    enable: str = ""  # the command that would let a not-run lane run here
    buckets: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0))
    duration_s: float = 0.0
    workers: int = 1
    returncode: int | None = None
    junit: str | None = None
    log: str | None = None
    problems: list[dict[str, str]] = field(default_factory=list)
    selected: list[str] = field(default_factory=list)  # node ids when only some tests ran

    def add(self, bucket: str, nodeid: str, message: str) -> None:
        self.buckets[bucket] += 1
        if bucket != "passed" and bucket != "skipped":
            self.problems.append({"bucket": bucket, "nodeid": nodeid, "message": message})

    @property
    def ok(self) -> bool:
        if self.status == "not-run":
            return True
        return self.status == "ran" and not any(self.buckets[b] for b in BAD_BUCKETS)


@dataclass(frozen=True)
class OutputDirs:
    """Where a run writes: logs, per-test results and summaries under `out_dir`, junit under
    `junit_dir`. One place names each lane's files, so clearing them misses none."""

    out_dir: Path
    junit_dir: Path

    def junit(self, lane: str) -> Path:
        return self.junit_dir / f"{lane}.xml"

    def results(self, lane: str) -> Path:
        return self.out_dir / "results" / f"{lane}.jsonl"

    def log(self, lane: str) -> Path:
        return self.out_dir / "logs" / f"{lane}.log"

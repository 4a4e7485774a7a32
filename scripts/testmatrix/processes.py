"""The lane's subprocess and the runner's own streams: its environment, waiting on it with
progress, taking its whole process group down, SIGTERM as Ctrl-C, and output to a reader who may
leave early.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from provision.floor import signals
from provision.floor.procgroup import kill_group
from scripts.testmatrix.schema import Lane

HARNESS_ROOT = Path(__file__).resolve().parents[2]


class PipeSafe:
    """A text stream whose reader may leave early (`invoke test --matrix | head`).

    The run goes on and its files (summary.json, junit) are still written; only output nobody
    reads is dropped. The descriptor is pointed at /dev/null so the flush at exit cannot fail.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._gone = False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                self._stream.write(text)
            except BrokenPipeError:
                self._reader_left()
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._reader_left()

    def isatty(self) -> bool:
        return not self._gone and self._stream.isatty()

    def _reader_left(self) -> None:
        self._gone = True
        try:
            fd = self._stream.fileno()
        except (OSError, ValueError, AttributeError):
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)


def lane_env(lane: Lane, root: Path, workers: int) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        # An outer pytest (e.g. the unit lane testing this runner) must not leak into lanes.
        if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT_TEST")) and k != "PYTEST_ADDOPTS"
    }
    paths = [str(root), str(HARNESS_ROOT)] + [p for p in [env.get("PYTHONPATH")] if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    # N workers each running torch with all cores oversubscribes a 2-core box and makes the
    # parallel lane slower than the serial one; give each worker its share.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    env.update(lane.env)
    return env


def terminate(proc: subprocess.Popen[bytes]) -> None:
    """Kill the lane's whole process group (pytest, xdist workers, their children)."""
    kill_group(proc, grace_s=5.0)


def wait_for_lane(
    proc: subprocess.Popen[bytes], deadline: float, tick: Callable[[], None]
) -> tuple[bool, bool]:
    """Wait for the lane, calling `tick` about once a second; (timed out, interrupted).

    Past `deadline` (time.monotonic()) or on a Ctrl-C/SIGTERM the lane's group is killed."""
    timed_out = interrupted = False
    try:
        while True:
            try:
                proc.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                tick()
                if time.monotonic() > deadline:
                    timed_out = True
                    terminate(proc)
                    break
    except KeyboardInterrupt:
        interrupted = True
        terminate(proc)
    return timed_out, interrupted


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (CI cancelling a job) raises KeyboardInterrupt like a Ctrl-C, so the run still
    reports what it finished; outside the main thread (an embedding tool) its handlers stay."""
    with signals.as_interrupt((signal.SIGTERM,)):
        yield


def read_records(path: Path) -> list[dict[str, Any]]:
    """The per-test records the plugin appended to `path` (one JSON object a line)."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
    return records


def lane_progress(records: list[dict[str, Any]]) -> tuple[int, int | None, list[str]]:
    """(tests finished, tests collected or None, node ids started but not finished)."""
    total = next((r["count"] for r in records if r.get("event") == "collected"), None)
    finished = {r["nodeid"] for r in records if r.get("event") is None and "bucket" in r}
    running = [
        r["nodeid"]
        for r in records
        if r.get("event") == "start" and r.get("nodeid") not in finished
    ]
    return len(finished), total, running


def log_tail(log: Path) -> str:
    """The log's last non-blank line (cut to 300 characters): what a crashed lane said last."""
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(no output)"

"""Run one lane: pytest (with the matrix plugin) or ruff, and bucket what happened.

A lane's outcome comes from the plugin's per-test records, never from pytest's exit code alone:
the code only adds what the records cannot say (a crash, a timeout, a usage error, a lane that
selects nothing).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from provision.floor import light, progress
from scripts.testmatrix.junit import finish_junit
from scripts.testmatrix.processes import (
    lane_env,
    lane_progress,
    log_tail,
    read_records,
    wait_for_lane,
)
from scripts.testmatrix.results import BAD_BUCKETS, LaneResult, OutputDirs
from scripts.testmatrix.schema import Lane

_atomic_write = light.load("atomic").write_text

_PYTEST_RC = {
    2: "pytest was interrupted (rc 2)",
    3: "pytest internal error (rc 3)",
    4: "pytest usage error (rc 4)",
    5: "no tests collected (rc 5): the lane selects nothing",
}

# Static import-cycle check over the repository at the lane's root (nothing is imported).
CHECK_IMPORTS = Path(__file__).resolve().parents[1] / "check_imports.py"


@dataclass(frozen=True)
class LaneContext:
    """What every lane of one run shares: the tree it tests, the files the plugin reads, where
    outputs go, and the run's overrides."""

    root: Path
    matrix_file: Path  # resolved: pytest runs in `root`, the path must not depend on the cwd
    caps_file: Path  # the capabilities this run detected (or was given), for the plugin
    outputs: OutputDirs
    workers: int | None = None  # --workers for every lane; None: each lane's own
    stream: TextIO | None = None  # where the progress heartbeat goes (standard output if None)
    pytest_args: tuple[str, ...] = ()  # the user's own pytest arguments, after the lane's


def _unmet_precondition(lane: Lane, root: Path, workers: int) -> str:
    """Why the lane cannot start at all (an infra-error), or ""."""
    missing_paths = [p for p in lane.paths if not (root / p).exists()]
    if missing_paths:
        return f"lane path(s) missing: {', '.join(missing_paths)}"
    if workers > 1 and importlib.util.find_spec("xdist") is None:
        return "missing tool: pytest-xdist (pip install it)"
    if lane.test_timeout and importlib.util.find_spec("pytest_timeout") is None:
        return "missing tool: pytest-timeout (pip install it)"
    return ""


def _pytest_command(
    lane: Lane, ctx: LaneContext, workers: int, nodeids: list[str] | None
) -> list[str]:
    results_file, junit = ctx.outputs.results(lane.name), ctx.outputs.junit(lane.name)
    cmd = [
        sys.executable, "-m", "pytest", "-p", "scripts.testmatrix.plugin",
        "--matrix-file", str(ctx.matrix_file), "--matrix-lane", lane.name,
        "--matrix-caps", str(ctx.caps_file), "--matrix-results", str(results_file),
        f"--junitxml={junit}", "-o", f"junit_suite_name={lane.name}",
        "--rootdir", str(ctx.root), "-p", "no:cacheprovider", "-q", "-rfE",
    ]  # fmt: skip
    if workers > 1:
        cmd += ["-n", str(workers)]
    if lane.test_timeout:
        # One hung test fails alone, named, and the lane's other results survive.
        cmd += [f"--timeout={lane.test_timeout:g}"]
    if lane.keyword:
        cmd += ["-k", lane.keyword]
    if lane.markers:
        cmd += ["-m", lane.markers]
    if nodeids:
        cmd += ["--matrix-subset", *nodeids]
    else:
        cmd += lane.paths
    if ctx.pytest_args:
        # the user's own selection (-k, -m, -x, node ids...) after the lane's: the lane's
        # expectations still apply, but staleness needs the whole lane
        cmd += ["--matrix-subset", *ctx.pytest_args] if not nodeids else list(ctx.pytest_args)
    return cmd


def run_pytest_lane(lane: Lane, ctx: LaneContext, nodeids: list[str] | None = None) -> LaneResult:
    """Run one lane (or only `nodeids` of it, and `ctx.pytest_args` passed through to pytest); a
    Ctrl-C/SIGTERM returns status "interrupted"."""
    workers = ctx.workers or lane.workers
    result = LaneResult(lane.name, "ran", workers=workers, selected=list(nodeids or []))
    start = time.monotonic()
    junit = ctx.outputs.junit(lane.name)
    unmet = _unmet_precondition(lane, ctx.root, workers)
    if unmet:
        result.add("infra-error", lane.name, unmet)
        finish_junit(result, junit)
        return result
    results_file = ctx.outputs.results(lane.name)
    results_file.parent.mkdir(parents=True, exist_ok=True)
    results_file.unlink(missing_ok=True)
    ctx.outputs.junit_dir.mkdir(parents=True, exist_ok=True)
    log = ctx.outputs.log(lane.name)
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = _pytest_command(lane, ctx, workers, nodeids)
    beat = progress.heartbeat(f"matrix {lane.name}", stream=ctx.stream or sys.stdout)

    def show_progress() -> None:
        done, total, running = lane_progress(read_records(results_file))
        beat.update(done=done, total=total, note=", ".join(running[:2]))

    with open(log, "wb") as log_fh, beat:
        proc = subprocess.Popen(
            cmd,
            cwd=ctx.root,
            env=lane_env(lane, ctx.root, workers),
            stdout=log_fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        # The lane runs in its own session (so a timeout can kill its whole group, and a
        # terminal's Ctrl-C reaches only the runner); the runner takes the lane down with it.
        timed_out, interrupted = wait_for_lane(proc, start + lane.timeout, show_progress)
    result.duration_s = time.monotonic() - start
    result.returncode = proc.returncode
    result.log = str(log)
    records = read_records(results_file)
    _classify(result, records, log, lane.timeout, timed_out=timed_out, interrupted=interrupted)
    finish_junit(result, junit, records)
    return result


def _classify(
    result: LaneResult,
    records: list[dict[str, Any]],
    log: Path,
    timeout: float,
    *,
    timed_out: bool,
    interrupted: bool,
) -> None:
    """Bucket the plugin's records into `result`, then what the way pytest ended adds."""
    for rec in records:
        event = rec.get("event")
        if event == "collect-error":
            result.add("infra-error", rec["nodeid"], f"collection error: {rec['message']}")
        elif event == "stale":
            result.add("infra-error", rec["expectation"], rec["message"])
        elif event is None:
            result.add(rec["bucket"], rec["nodeid"], rec.get("message", ""))
    done, _, running = lane_progress(records)
    rc = result.returncode
    if interrupted:
        result.status = "interrupted"
        for nodeid in running:
            result.add("infra-error", nodeid, "interrupted while running (Ctrl-C/SIGTERM)")
        if not running:
            result.add("infra-error", result.name, f"interrupted ({done} finished)")
    elif timed_out:
        for nodeid in running:
            result.add(
                "infra-error", nodeid, f"still running when the lane timed out ({timeout:.0f}s)"
            )
        result.add(
            "infra-error",
            result.name,
            f"lane timeout after {timeout:.0f}s ({done} finished"
            + (f"; hung: {', '.join(running)}" if running else "")
            + ")",
        )
    elif rc is not None and rc < 0:
        result.add("infra-error", result.name, f"pytest died with signal {-rc}: {log_tail(log)}")
    elif rc in _PYTEST_RC:
        if not (rc == 2 and result.buckets["infra-error"]):
            result.add("infra-error", result.name, f"{_PYTEST_RC[rc]}: {log_tail(log)}")
    elif rc == 1 and not any(result.buckets[b] for b in BAD_BUCKETS):
        result.add(
            "infra-error", result.name, f"pytest failed with no failing test: {log_tail(log)}"
        )


def run_ruff_lane(lane: Lane, ctx: LaneContext) -> LaneResult:
    """`ruff check`, `ruff format --check` and the import-cycle check, each one test case."""
    result = LaneResult(lane.name, "ran")
    junit = ctx.outputs.junit(lane.name)
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not os.access(ruff, os.X_OK):
        result.add("infra-error", lane.name, "missing tool: ruff (pip install ruff)")
        finish_junit(result, junit)
        return result
    records: list[dict[str, Any]] = []
    log = ctx.outputs.log(lane.name)
    log.parent.mkdir(parents=True, exist_ok=True)
    log_text = []
    start = time.monotonic()
    commands = (
        ("ruff-check", [ruff, "check", *lane.paths]),
        ("ruff-format", [ruff, "format", "--check", *lane.paths]),
        ("import-cycles", [sys.executable, str(CHECK_IMPORTS), str(ctx.root)]),
    )
    for name, argv in commands:
        nodeid = f"lint::{name}"
        try:
            proc = subprocess.run(
                argv,
                cwd=ctx.root,
                capture_output=True,
                text=True,
                timeout=lane.timeout,
            )
        except subprocess.TimeoutExpired:
            result.add("infra-error", nodeid, f"timeout after {lane.timeout:.0f}s")
            continue
        output = (proc.stdout + proc.stderr).strip()
        log_text.append(f"$ {' '.join(argv)}\n{output}\n")
        if proc.returncode == 0:
            result.add("passed", nodeid, "")
            records.append({"nodeid": nodeid, "bucket": "passed"})
        elif proc.returncode == 1:
            summary = next((ln for ln in reversed(output.splitlines()) if ln.strip()), "")
            result.add("failed", nodeid, summary)
            records.append({"nodeid": nodeid, "bucket": "failed", "message": output or summary})
        else:  # rc 2: the tool itself could not run (bad config, bad path, unparsable file)
            result.add("infra-error", nodeid, f"{name} rc {proc.returncode}: {output[:200]}")
    result.duration_s = time.monotonic() - start
    _atomic_write(log, "\n".join(log_text))
    result.log = str(log)
    junit.unlink(missing_ok=True)
    finish_junit(result, junit, records)
    return result

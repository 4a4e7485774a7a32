"""Run a matrix: validate the request, plan, run each lane in turn, report.

The run succeeds only when no lane has failed, unexpected-pass or infra-error (see `results`).
The jobs it orchestrates live in their own modules: `request` (what was asked, and the usage
checks), `rerun` (earlier runs' outputs), `lanes` (one lane), `output` (tables, summaries).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

from provision.floor import light
from scripts.testmatrix.capabilities import detect, enable_hint
from scripts.testmatrix.junit import finish_junit
from scripts.testmatrix.lanes import LaneContext, run_pytest_lane, run_ruff_lane
from scripts.testmatrix.output import (
    RunReport,
    format_plan,
    format_problems,
    format_resume,
    format_table,
    not_run_text,
    write_reports,
)
from scripts.testmatrix.platforms import profile
from scripts.testmatrix.processes import PipeSafe, sigterm_interrupts
from scripts.testmatrix.request import MatrixRun, check_outputs, chosen_lanes
from scripts.testmatrix.rerun import clear_outputs, earlier_lanes, exclusive, failed_last_time
from scripts.testmatrix.results import INTERRUPTED, LaneResult, OutputDirs
from scripts.testmatrix.schema import Lane, MatrixError, load

_atomic_write = light.load("atomic").write_text

Rerun = dict[str, list[str] | None]  # lane -> the node ids to rerun (None: the whole lane)


def _platform_caps(run: MatrixRun) -> tuple[dict[str, Any] | None, str]:
    """The capabilities to plan with and where they come from: a forced profile, the caller's,
    or (None) detected on this machine when the run starts."""
    if run.platform is not None:
        try:
            return profile(run.platform), run.platform
        except KeyError as err:
            raise MatrixError(str(run.matrix_file), 0, str(err.args[0])) from None
    if run.caps is not None:
        return run.caps, "given"  # callers that already know (tests, a wrapping tool)
    return None, "detected"


def _run_lane(
    lane: Lane, ctx: LaneContext, subset: list[str] | None, caps: dict[str, Any]
) -> LaneResult:
    """One lane that can run here; a Ctrl-C/SIGTERM before it got going is still recorded."""
    try:
        if lane.kind == "ruff":
            return run_ruff_lane(lane, ctx)
        if lane.delegated(caps):
            # Imported here: the farm and lab code is no concern of a run without such a lane.
            from scripts.testmatrix.board_lane import run_on_emulated_board

            return run_on_emulated_board(lane, ctx.root, ctx.matrix_file, ctx.outputs, ctx.stream)
        return run_pytest_lane(lane, ctx, nodeids=subset)
    except KeyboardInterrupt:
        res = LaneResult(lane.name, "interrupted")
        res.add("infra-error", lane.name, "interrupted (Ctrl-C/SIGTERM)")
        finish_junit(res, ctx.outputs.junit(lane.name))
        return res


def _run_lanes(
    selected: list[Lane],
    results: list[LaneResult],
    caps: dict[str, Any],
    ctx: LaneContext,
    rerun: Rerun | None,
) -> str | None:
    """Run each lane in turn, appending to `results`; the name of the lane a Ctrl-C/SIGTERM
    interrupted, or None."""
    for lane in selected:
        missing = lane.missing(caps)
        if missing:
            hint = enable_hint(missing)
            results.append(LaneResult(lane.name, "not-run", missing=missing, enable=hint))
            print(f"[matrix] {lane.name}: {not_run_text(missing, hint)}", file=ctx.stream)
            continue
        subset = rerun.get(lane.name) if rerun else None
        print(
            f"[matrix] {lane.name}: running ({ctx.workers or lane.workers} worker(s))"
            + (f", {len(subset)} test(s) that failed last time" if subset else "")
            + " ...",
            file=ctx.stream,
            flush=True,
        )
        res = _run_lane(lane, ctx, subset, caps)
        results.append(res)
        if res.status == "interrupted":
            return lane.name
    return None


def _detect_and_run(
    run: MatrixRun,
    selected: list[Lane],
    caps: dict[str, Any] | None,
    rerun: Rerun | None,
    stream: TextIO,
) -> tuple[list[LaneResult], dict[str, Any] | None, str | None]:
    """(the lanes' results, the capabilities they ran with (None: interrupted before detecting),
    the lane a Ctrl-C/SIGTERM interrupted or None); an interrupt in here is reported, not raised."""
    outputs = run.outputs
    results: list[LaneResult] = []
    interrupted_lane: str | None = None
    with sigterm_interrupts():
        try:
            if caps is None:
                try:
                    caps = detect()
                except KeyboardInterrupt:  # still reported: summary marked interrupted, 130
                    caps, interrupted_lane = {}, "(detecting capabilities)"
            caps_file = outputs.out_dir / "capabilities.json"
            _atomic_write(caps_file, json.dumps(caps, indent=2))
            if not interrupted_lane:
                ctx = LaneContext(
                    root=run.root,
                    matrix_file=run.matrix_file.resolve(),
                    caps_file=caps_file,
                    outputs=outputs,
                    workers=run.workers,
                    stream=stream,
                    pytest_args=run.pytest_args,
                )
                interrupted_lane = _run_lanes(selected, results, caps, ctx, rerun)
        except KeyboardInterrupt:
            interrupted_lane = interrupted_lane or "(between lanes)"
    return results, caps, interrupted_lane


def _fail_required_not_run(
    results: list[LaneResult], required: list[str], outputs: OutputDirs
) -> None:
    """A required lane that could not run is an infra-error, never "not run"."""
    for name in required:
        res = next((r for r in results if r.name == name), None)
        if res is not None and res.status == "not-run":
            res.status = "ran"
            res.add(
                "infra-error",
                name,
                f"required lane cannot run here: missing {', '.join(res.missing)}"
                + (f"; enable: {res.enable}" if res.enable else ""),
            )
            finish_junit(res, outputs.junit(name))


def _show(
    results: list[LaneResult], selected: list[Lane], interrupted: str | None, stream: TextIO
) -> int:
    """Print the lane table, the problems and (when interrupted) how to resume; the exit code."""
    print(format_table(results), file=stream)
    problems = format_problems(results)
    if problems:
        print(problems, file=stream)
    if interrupted is not None:
        print(format_resume(results, selected, interrupted), file=stream)
        return INTERRUPTED
    return 0 if all(r.ok for r in results) else 1


def run_matrix(run: MatrixRun, stream: TextIO | None = None) -> int:
    """Validate, plan, run, report. Returns the exit code (0 only when every ran lane is clean,
    130 when interrupted). Bad input raises MatrixError (the matrix file) or UsageError (flags)."""
    # `--json -`: standard output carries only the JSON summary; people read the rest on stderr.
    stream = PipeSafe(stream or (sys.stderr if run.json_to_stdout else sys.stdout))
    matrix = load(run.matrix_file)
    selected, required = chosen_lanes(run, matrix)
    caps, platform_name = _platform_caps(run)
    if run.list_only or run.platform is not None:
        # A forced profile describes another machine: show what would happen there, run nothing.
        caps = caps if caps is not None else detect()
        print(format_plan(matrix, selected, caps, platform_name), file=stream)
        return 0
    check_outputs(run)
    outputs = run.outputs
    with exclusive(outputs.out_dir):
        rerun: Rerun | None = None
        if run.rerun_failed:
            rerun = failed_last_time(outputs.out_dir / "summary.json", matrix)
            selected = [lane for lane in selected if lane.name in rerun]
            if not selected:
                print("[matrix] nothing failed in the last run; nothing to rerun", file=stream)
                return 0
        # Results of lanes this run does not cover stay (files and summary entries): a run replaces
        # what it runs and nothing else. Cleared before detecting (seconds): a Ctrl-C there must not
        # leave the last run's summary of the lanes it covers.
        covered = [lane.name for lane in selected]
        earlier = earlier_lanes(outputs.out_dir / "summary.json", set(covered))
        clear_outputs(outputs, covered)
        started = time.time()
        results, caps, interrupted_lane = _detect_and_run(run, selected, caps, rerun, stream)
        if interrupted_lane is None:
            _fail_required_not_run(results, required, outputs)
        code = _show(results, selected, interrupted_lane, stream)
        report = RunReport(
            results, code, caps, platform_name, started, interrupted_lane, covered, earlier
        )
        write_reports(report, run, stream)
        return code

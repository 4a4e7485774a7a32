"""What a run shows and leaves behind: the plan, the lane table, the problem list, the Markdown
summary, and the summary files (summary.json, --json, summary.md, $GITHUB_STEP_SUMMARY).

Text only: nothing here runs a lane.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from provision.floor import light
from scripts.testmatrix.capabilities import enable_hint
from scripts.testmatrix.processes import PipeSafe
from scripts.testmatrix.request import MatrixRun
from scripts.testmatrix.results import BAD_BUCKETS, BUCKETS, INTERRUPTED, LaneResult
from scripts.testmatrix.schema import Lane, Matrix

_atomic_write = light.load("atomic").write_text

_SHORT = {"expected-fail": "xfail", "unexpected-pass": "xpass", "infra-error": "infra"}


def not_run_text(missing: list[str], enable: str) -> str:
    text = f"not run (missing: {', '.join(missing)})"
    return f"{text}; enable: {enable}" if enable else text


def format_plan(matrix: Matrix, lanes: list[Lane], caps: dict[str, Any], platform: str) -> str:
    out = [
        f"platform: {platform}",
        "capabilities: " + ", ".join(f"{k}={v}" for k, v in caps.items()),
    ]
    out.append(f"{'lane':<18}{'kind':<8}{'workers':>8}{'timeout':>9}{'per test':>10}  plan")
    for lane in lanes:
        missing = lane.missing(caps)
        plan = (
            not_run_text(missing, enable_hint(missing))
            if missing
            else "run " + " ".join(lane.paths)
        )
        if not missing and lane.markers:
            plan += f" -m {lane.markers!r}"
        if not missing and lane.delegated(caps):
            plan += f", on the emulated board ({lane.on_board} image)"
        per_test = f"{lane.test_timeout:.0f}s" if lane.test_timeout else "-"
        out.append(
            f"{lane.name:<18}{lane.kind:<8}{lane.workers:>8}{lane.timeout:>8.0f}s"
            f"{per_test:>10}  {plan}"
        )
        for exp in matrix.expectations:
            if exp.active(lane.name, caps):
                out.append(
                    f"{'':<18}expect {exp.status}: {exp.test}  [{exp.location}: {exp.reason}]"
                )
    return "\n".join(out)


def _verdict(r: LaneResult) -> str:
    if r.status == "interrupted":
        return "INTERRUPTED"
    if r.status == "not-run":
        return not_run_text(r.missing, r.enable)
    return "ok" if r.ok else "FAIL"


def _rows(results: list[LaneResult]) -> tuple[list[str], list[list[str]]]:
    heads = ["lane", *(_SHORT.get(b, b) for b in BUCKETS), "workers", "time", "result"]
    rows = []
    for r in results:
        if r.status == "not-run":
            rows.append([r.name, *["-"] * len(BUCKETS), "-", "-", _verdict(r)])
        else:
            counts = [str(r.buckets[b]) for b in BUCKETS]
            rows.append([r.name, *counts, str(r.workers), f"{r.duration_s:.1f}s", _verdict(r)])
    total = sum(r.duration_s for r in results)
    sums = [str(sum(r.buckets[b] for r in results if r.status != "not-run")) for b in BUCKETS]
    rows.append(["total", *sums, "", f"{total:.1f}s", ""])
    return heads, rows


def format_table(results: list[LaneResult]) -> str:
    heads, rows = _rows(results)
    rows = [heads, *rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(heads) - 1)]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:-1], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells + [row[-1]]).rstrip())
    return "\n".join(lines)


def format_problems(results: list[LaneResult], limit: int = 20) -> str:
    out = []
    for r in results:
        for p in r.problems[:limit]:
            if p["bucket"] == "expected-fail":
                continue
            out.append(f"  [{r.name}] {p['bucket']}: {p['nodeid']}: {p['message']}")
        if r.log and not r.ok:
            out.append(f"  [{r.name}] full log: {r.log}")
    return "\n".join(out)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").replace("`", "'")


def format_markdown(results: list[LaneResult], code: int, platform: str, limit: int = 20) -> str:
    """The lane table and every failure with its first error line, as GitHub Markdown."""
    verdict = {0: "passed", INTERRUPTED: "interrupted"}.get(code, "FAILED")
    heads, rows = _rows(results)
    out = [
        f"## Test matrix: {verdict}",
        "",
        f"platform: {platform}",
        "",
        "| " + " | ".join(heads) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(heads) - 2) + ["---"]) + "|",
    ]
    out += ["| " + " | ".join(_md(c) for c in row) + " |" for row in rows]
    failures = [(r.name, p) for r in results for p in r.problems if p["bucket"] in BAD_BUCKETS]
    if failures:
        out += ["", "### Failures", ""]
        for lane, p in failures[:limit]:
            first = p["message"].strip().splitlines()[0] if p["message"].strip() else ""
            out.append(f"- **{lane}** {p['bucket']}: `{_md(p['nodeid'])}`: {_md(first)[:300]}")
        if len(failures) > limit:
            out.append(f"- ... and {len(failures) - limit} more (see summary.json)")
    if code == INTERRUPTED:
        out += ["", "The run was interrupted; re-run to finish the remaining lanes."]
    return "\n".join(out) + "\n"


def format_resume(results: list[LaneResult], selected: list[Lane], interrupted_lane: str) -> str:
    """What an interrupted run finished and the command that runs the rest."""
    done = [r.name for r in results if r.status == "ran"]
    remaining = [lane.name for lane in selected if lane.name not in done]
    return (
        f"[matrix] interrupted during {interrupted_lane}; finished: "
        f"{', '.join(done) or 'none'}; not finished: {', '.join(remaining)}. "
        f"Re-run to resume: invoke test --lane {','.join(remaining)}"
    )


@dataclass
class RunReport:
    """What one run found, as its summary records it."""

    results: list[LaneResult]
    code: int
    caps: dict[str, Any] | None
    platform: str  # a profile's name, "given" or "detected"
    started: float  # time.time() when the first lane was about to start
    interrupted_lane: str | None
    covered: list[str]  # the lanes this run selected
    # what the previous summaries recorded for the other lanes (kept, so --rerun-failed still
    # sees their failures)
    earlier: list[dict[str, Any]]


def write_reports(report: RunReport, run: MatrixRun, stream: TextIO) -> None:
    """summary.json (and --json), summary.md and $GITHUB_STEP_SUMMARY."""
    summary = {
        "platform": report.platform,
        "capabilities": report.caps,
        "started": report.started,
        "duration_s": time.time() - report.started,
        "exit_code": report.code,
        "interrupted": report.interrupted_lane is not None,
        "interrupted_lane": report.interrupted_lane,
        "rerun_failed": run.rerun_failed,
        "covered": list(report.covered),
        "lanes": [asdict(r) for r in report.results],
        "earlier_lanes": list(report.earlier),
    }
    text = json.dumps(summary, indent=2)
    out_dir = run.outputs.out_dir
    _atomic_write(out_dir / "summary.json", text)
    if run.json_to_stdout:
        print(text, file=PipeSafe(sys.stdout), flush=True)
    elif run.json_path is not None:
        _atomic_write(run.json_path, text)
    markdown = format_markdown(report.results, report.code, report.platform)
    _atomic_write(out_dir / "summary.md", markdown)
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        try:
            with open(step_summary, "a", encoding="utf-8") as fh:
                fh.write(markdown)
        except OSError as err:
            print(f"[matrix] cannot append to $GITHUB_STEP_SUMMARY: {err}", file=stream)

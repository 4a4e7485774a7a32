"""The outputs of earlier runs: one run per output directory at a time, clearing what this run
replaces, keeping what it does not, and `--rerun-failed` (what failed last time).

Reports are only ever about this run: every output of the previous run of a lane (junit, results,
log) and the summaries are removed before the first lane starts, so a lane killed half-way can
never be represented by an older, greener file.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from provision.floor import locks
from scripts.testmatrix.request import UsageError
from scripts.testmatrix.results import BAD_BUCKETS, OutputDirs
from scripts.testmatrix.schema import Matrix


class _Busy(UsageError):
    pass


@contextlib.contextmanager
def exclusive(out_dir: Path) -> Iterator[None]:
    """One matrix run per output directory at a time: two runs in one checkout would clear and
    rewrite each other's junit files and summaries. The lock is an flock, so it ends with its
    process, however that ends."""
    busy = _Busy(
        f"another matrix run is writing {out_dir} now; wait for it to finish (or run this "
        "one as `python -m scripts.testmatrix --out-dir DIR`)"
    )
    with locks.held(out_dir / ".run.lock", lambda: busy):
        yield


def earlier_lanes(summary_file: Path, covered: set[str]) -> list[dict[str, Any]]:
    """The lane records of the last summary (its own and those it kept) for lanes outside
    `covered`; an unreadable summary keeps nothing."""
    try:
        summary = json.loads(summary_file.read_text(encoding="utf-8"))
        records = [*summary.get("earlier_lanes", []), *summary["lanes"]]
        kept = {r["name"]: r for r in records if isinstance(r, dict) and "name" in r}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []
    return [record for name, record in kept.items() if name not in covered]


def clear_outputs(outputs: OutputDirs, lane_names: list[str]) -> None:
    """Remove every output a previous run left for these lanes (and the summaries)."""
    for name in lane_names:
        for path in (outputs.junit(name), outputs.results(name), outputs.log(name)):
            path.unlink(missing_ok=True)
    for name in ("summary.json", "summary.md"):
        (outputs.out_dir / name).unlink(missing_ok=True)


def failed_last_time(summary_file: Path, matrix: Matrix) -> dict[str, list[str] | None]:
    """lane -> node ids that failed in the run recorded in `summary_file` (None: the whole lane).

    Lane-level problems (timeout, crash, stale expectation, a lint failure) rerun the whole
    lane; test failures rerun just those tests.
    """
    if not summary_file.is_file():
        raise UsageError(
            f"--rerun-failed: no results of an earlier run in {summary_file}; "
            "run `invoke test --matrix` first"
        )
    try:
        summary = json.loads(summary_file.read_text(encoding="utf-8"))
        selection = _failed_lanes([*summary.get("earlier_lanes", []), *summary["lanes"]], matrix)
        if summary.get("interrupted"):
            # Lanes the interrupted run never reached have not passed either: run them whole.
            reached = {lane["name"] for lane in summary["lanes"]}
            covered = summary.get("covered") or list(matrix.lanes)
            selection.update({n: None for n in covered if n in matrix.lanes and n not in reached})
        return selection
    except (ValueError, KeyError, TypeError, AttributeError):
        # Any shape other than the one run_matrix writes (a hand edit, a cut-short copy).
        raise UsageError(
            f"--rerun-failed: {summary_file} is not a matrix summary; run the matrix again"
        ) from None


def _failed_lanes(lanes: list[dict[str, Any]], matrix: Matrix) -> dict[str, list[str] | None]:
    if not isinstance(lanes, list):
        raise TypeError("lanes is not a list")
    selection: dict[str, list[str] | None] = {}
    for lane in lanes:
        name = lane.get("name")
        if not isinstance(name, str):
            raise TypeError("a lane without a name")
        if name not in matrix.lanes:
            continue
        if lane.get("status") == "not-run":
            continue
        bad = [p for p in lane.get("problems", []) if p.get("bucket") in BAD_BUCKETS]
        if not bad:
            continue
        nodeids = [str(p["nodeid"]) for p in bad]
        whole = matrix.lanes[name].kind != "pytest" or any(
            "::" not in n and not n.endswith(".py") for n in nodeids
        )
        selection[name] = None if whole else list(dict.fromkeys(nodeids))
    return selection

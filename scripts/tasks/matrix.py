"""invoke tasks for the test matrix: `invoke test [--matrix ...]` and `invoke matrix-update`.

The logic lives in scripts/testmatrix (also runnable as `python -m scripts.testmatrix`); these
tasks only translate flags. Matrix file problems exit 2 with one line, never a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path

from invoke import Collection, Context, Exit, task

from provision.floor import outpaths
from scripts.tasks.cli import INTERRUPTED_CODE, CliTask, bad_flag, int_flag, split_names

ROOT = Path(__file__).resolve().parents[2]


def _pass_through() -> list[str]:
    """What the command line has after `--` (invoke keeps it out of the task's arguments)."""
    argv = sys.argv
    return argv[argv.index("--") + 1 :] if "--" in argv else []


@task(
    klass=CliTask,
    short={"list": "l"},
    iterable=["lane", "require"],
    help={
        "matrix": "run every lane of matrix.yaml that applies to this machine",
        "lane": "only these lanes (repeatable, or a comma list); implies --matrix",
        "list": "validate matrix.yaml and show the plan (lanes, capabilities, expectations)",
        "platform": "force a profile (x86-ci, x86-dev, rdk-s100, rdk-s600, gpu-host): dry run",
        "json": "also write the JSON summary to this file (- for standard output)",
        "junit_dir": "junit XML per lane here (default out/matrix/junit)",
        "workers": "override every lane's pytest-xdist workers, an integer >= 1 (for measuring)",
        "require": "fail when this lane cannot run on this machine (repeatable, or a comma list)",
        "rerun_failed": "rerun only the tests (or lanes) that failed in the last run on disk",
    },
)
def test(
    c: Context,
    matrix: bool = False,
    lane: list[str] | None = None,
    list: bool = False,  # noqa: A002 - the flag is --list
    platform: str | None = None,
    json: str | None = None,
    junit_dir: str | None = None,
    workers: str | None = None,
    require: list[str] | None = None,
    rerun_failed: bool = False,
) -> None:
    """Run the tests. Without --matrix or --lane: the unit lane's quick tests (not `slow`).

    Arguments after `--` go to pytest in every pytest lane run (`invoke test --lane unit -- -k
    envfile -x`), with the lanes' expectations still applied.
    """
    from scripts.testmatrix.request import MatrixRun, UsageError
    from scripts.testmatrix.results import INTERRUPTED
    from scripts.testmatrix.runner import run_matrix
    from scripts.testmatrix.schema import MAX_WORKERS, MatrixError

    workers_n = int_flag("--workers", workers, maximum=MAX_WORKERS)
    lanes = split_names(lane or [])
    if lane and not lanes:
        raise bad_flag("--lane", ",".join(lane), "name at least one lane (invoke test --list)")
    if json is not None and not json.strip():
        raise bad_flag("--json", json, "give a file path")
    if junit_dir is not None and not junit_dir.strip():
        raise bad_flag("--junit-dir", junit_dir, "give a directory path")
    pytest_args = _pass_through()
    if not (matrix or lanes or list or platform or rerun_failed):
        # the quick default: the unit lane without its slow tests (`-m "not slow"`), what a
        # developer runs before each commit; the matrix's unit lane runs them all
        lanes = ["unit"]
        pytest_args = pytest_args or ["-m", "not slow"]
    try:
        code = run_matrix(
            MatrixRun(
                root=ROOT,
                matrix_file=ROOT / "matrix.yaml",
                lanes=lanes or None,
                platform=platform,
                list_only=list,
                json_path=Path(json).expanduser() if json else None,
                junit_dir=Path(junit_dir).expanduser() if junit_dir else None,
                workers=workers_n,
                require=require or None,
                rerun_failed=rerun_failed,
                pytest_args=pytest_args,
            )
        )
    except (MatrixError, UsageError) as err:
        raise Exit(f"error: {err}", code=2) from None
    except KeyboardInterrupt:
        # Interrupted before any lane started (while detecting capabilities): nothing ran.
        print("[matrix] interrupted before any lane ran; nothing to report", file=sys.stderr)
        raise Exit(code=INTERRUPTED) from None
    if code:
        raise Exit(code=code)


@task(
    klass=CliTask,
    help={
        "junit_dir": "junit XML from a matrix run (default out/matrix/junit)",
        "write": "apply the proposed changes to matrix.yaml instead of only printing the diff",
    },
)
def matrix_update(c: Context, junit_dir: str | None = None, write: bool = False) -> None:
    """Propose matrix.yaml expectation changes from the last run's junit results."""
    from scripts.testmatrix.schema import MatrixError
    from scripts.testmatrix.update import main as update_main

    if junit_dir is not None and not junit_dir.strip():
        raise bad_flag("--junit-dir", junit_dir, "give a directory path (or leave the flag out)")
    if junit_dir is not None:
        given = Path(junit_dir).expanduser()
        problem = outpaths.lookup_problem(given)
        if problem is None and given.exists() and not given.is_dir():
            problem = "is not a directory; give the junit directory of a matrix run"
        if problem:
            raise bad_flag("--junit-dir", junit_dir, problem)
    try:
        code = update_main(
            matrix_file=ROOT / "matrix.yaml",
            junit_dir=given if junit_dir else ROOT / "out" / "matrix" / "junit",
            write=write,
        )
    except MatrixError as err:
        raise Exit(f"error: {err}", code=2) from None
    except KeyboardInterrupt:
        # --write replaces matrix.yaml with one rename: it holds the old text or the new one.
        print("matrix-update: interrupted; matrix.yaml is unchanged or fully written, never half",
              file=sys.stderr)  # fmt: skip
        raise Exit(code=INTERRUPTED_CODE) from None
    if code:
        raise Exit(code=code)


def register(ns: Collection) -> None:
    """Add `test` and `matrix-update` to the root collection."""
    ns.add_task(test)
    ns.add_task(matrix_update)

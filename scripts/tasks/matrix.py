"""invoke tasks for the test matrix: `invoke test [--matrix ...]` and `invoke matrix-update`.

The logic lives in scripts/testmatrix (also runnable as `python -m scripts.testmatrix`); these
tasks only translate flags. Matrix file problems exit 2 with one line, never a traceback.
"""

from __future__ import annotations

from pathlib import Path

from invoke import Collection, Context, Exit, task

ROOT = Path(__file__).resolve().parents[2]


def _lanes(values: list[str]) -> list[str]:
    return [n.strip() for v in values for n in v.split(",") if n.strip()]


@task(
    iterable=["lane", "require"],
    help={
        "matrix": "run every lane of matrix.yaml that applies to this machine",
        "lane": "only these lanes (repeatable, or a comma list); implies --matrix",
        "list": "validate matrix.yaml and show the plan (lanes, capabilities, expectations)",
        "platform": "force a profile (x86-ci, x86-dev, rdk-s100, rdk-s600, gpu-host): dry run",
        "json": "write the JSON summary to this path",
        "junit_dir": "junit XML per lane here (default out/matrix/junit)",
        "workers": "override every lane's pytest-xdist workers (for measuring)",
        "require": "fail when this lane cannot run on this machine (repeatable)",
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
    workers: int | None = None,
    require: list[str] | None = None,
) -> None:
    """Run the tests. Without --matrix: the quick unit lane only."""
    from scripts.testmatrix.runner import run_matrix
    from scripts.testmatrix.schema import MatrixError

    lanes = _lanes(lane or [])
    if not (matrix or lanes or list or platform):
        lanes = ["unit"]  # the quick default
    try:
        code = run_matrix(
            root=ROOT,
            matrix_file=ROOT / "matrix.yaml",
            lanes=lanes or None,
            platform=platform,
            list_only=list,
            json_path=Path(json) if json else None,
            junit_dir=Path(junit_dir) if junit_dir else None,
            workers=workers,
            require=_lanes(require or []),
        )
    except MatrixError as err:
        raise Exit(f"error: {err}", code=2) from None
    if code:
        raise Exit(code=code)


@task(
    help={
        "junit_dir": "junit XML from a matrix run (default out/matrix/junit)",
        "write": "apply the proposed changes to matrix.yaml instead of only printing the diff",
    }
)
def matrix_update(c: Context, junit_dir: str | None = None, write: bool = False) -> None:
    """Propose matrix.yaml expectation changes from the last run's junit results."""
    from scripts.testmatrix.schema import MatrixError
    from scripts.testmatrix.update import main as update_main

    try:
        code = update_main(
            matrix_file=ROOT / "matrix.yaml",
            junit_dir=Path(junit_dir) if junit_dir else ROOT / "out" / "matrix" / "junit",
            write=write,
        )
    except MatrixError as err:
        raise Exit(f"error: {err}", code=2) from None
    if code:
        raise Exit(code=code)


def register(ns: Collection) -> None:
    """Add `test` and `matrix-update` to the root collection."""
    ns.add_task(test)
    ns.add_task(matrix_update)

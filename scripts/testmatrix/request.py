"""What one matrix run is asked to do (`MatrixRun`) and the checks on it that fail as usage errors.

The command line (`python -m scripts.testmatrix`, `invoke test`) builds one `MatrixRun`; every
flag's value is checked here before any output of an earlier run is touched.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision.floor import outpaths
from scripts.testmatrix.results import OutputDirs
from scripts.testmatrix.schema import Lane, Matrix


class UsageError(Exception):
    """A bad command-line value (output path, --require lane, --rerun-failed without results)."""


@dataclass(frozen=True)
class MatrixRun:
    """Everything one matrix run needs, fixed before the matrix file is read.

    None means "not given" throughout (all lanes, the detected platform, the default output
    directories), which is not the same as an empty value: `--lane ''` is a usage error.
    """

    root: Path
    matrix_file: Path
    lanes: tuple[str, ...] | None = None  # --lane values, each maybe a comma list
    platform: str | None = None  # a forced capability profile: a dry run
    list_only: bool = False
    json_path: Path | None = None  # Path("-"): the JSON summary alone on standard output
    junit_dir: Path | None = None
    out_dir: Path | None = None
    workers: int | None = None  # every lane's workers (measuring); None: each lane's own
    require: tuple[str, ...] | None = None  # --require values, each maybe a comma list
    rerun_failed: bool = False
    pytest_args: tuple[str, ...] = ()  # passed through to every pytest lane
    caps: dict[str, Any] | None = None  # known capabilities (tests, a wrapping tool); None: detect

    def __post_init__(self) -> None:
        # Callers hand over argparse's lists; the run keeps tuples so nothing can change them.
        for name in ("lanes", "require"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(value))
        object.__setattr__(self, "pytest_args", tuple(self.pytest_args or ()))

    @property
    def json_to_stdout(self) -> bool:
        return self.json_path is not None and str(self.json_path) == "-"

    @property
    def outputs(self) -> OutputDirs:
        out_dir = self.out_dir or self.root / "out" / "matrix"
        return OutputDirs(out_dir, self.junit_dir or out_dir / "junit")


def select_lanes(matrix: Matrix, names: tuple[str, ...] | None) -> list[Lane]:
    """Lanes named on the command line (comma lists allowed), in matrix order; all if none."""
    if not names:
        return list(matrix.lanes.values())
    wanted = [n.strip() for item in names for n in item.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in matrix.lanes]
    if unknown:  # a flag value, not a line of matrix.yaml
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, list(matrix.lanes), n=1)
            hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise UsageError(
            f"--lane: unknown lane(s) {', '.join(hints)}; known: {', '.join(matrix.lanes)}"
        )
    return [lane for name, lane in matrix.lanes.items() if name in wanted]


def _required_lanes(
    matrix: Matrix, selected: list[Lane], require: tuple[str, ...] | None
) -> list[str]:
    """The lanes `--require` names (comma lists allowed), each known and selected."""
    required = [n.strip() for item in require or [] for n in item.split(",") if n.strip()]
    if require is not None and not required:
        raise UsageError(f"--require {','.join(require)!r}: name at least one lane")
    unknown = [n for n in required if n not in matrix.lanes]
    if unknown:
        raise UsageError(
            f"--require: unknown lane(s) {', '.join(unknown)}; known: {', '.join(matrix.lanes)}"
        )
    unselected = [n for n in required if n not in {lane.name for lane in selected}]
    if unselected:
        raise UsageError(
            f"--require {', '.join(unselected)}: not among the selected lanes; add it to --lane"
        )
    return required


def _check_workers(workers: int | None) -> None:
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)):
        raise UsageError(f"--workers {workers!r}: use a whole number >= 1")
    if workers is not None and workers < 1:
        raise UsageError(f"--workers {workers}: use a whole number >= 1")


def chosen_lanes(run: MatrixRun, matrix: Matrix) -> tuple[list[Lane], list[str]]:
    """(the lanes to run, the names of those that must run), after checking --lane, --require
    and --workers."""
    lanes = run.lanes
    # A flag given with an empty value ("$UNSET") is a mistake, never "no selection": an empty
    # --require would let a lane CI exists to prove pass as "not run".
    if lanes is not None and not [n for item in lanes for n in item.split(",") if n.strip()]:
        raise UsageError(f"--lane {','.join(lanes)!r}: name at least one lane (--list shows them)")
    selected = select_lanes(matrix, lanes)
    required = _required_lanes(matrix, selected, run.require)
    _check_workers(run.workers)
    return selected, required


def check_outputs(run: MatrixRun) -> None:
    """Every output path is one this run can write, and none of them is the matrix file."""
    dirs = run.outputs
    json_path = None if run.json_to_stdout else run.json_path
    problems = [("--out-dir", dirs.out_dir, outpaths.dir_problem(dirs.out_dir))]
    problems.append(("--junit-dir", dirs.junit_dir, outpaths.dir_problem(dirs.junit_dir)))
    if json_path is not None:
        problems.append(("--json", json_path, outpaths.file_problem(json_path)))
    for flag, path, problem in problems:
        if problem:
            raise UsageError(f"{flag} {outpaths.shown(path)}: {problem}")
    if (
        run.json_path is not None
        and Path(run.json_path).resolve() == Path(run.matrix_file).resolve()
    ):
        raise UsageError(f"--json {str(run.json_path)!r} is the matrix file; choose another path")

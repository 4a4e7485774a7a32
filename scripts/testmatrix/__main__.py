"""`python -m scripts.testmatrix`: the matrix runner without invoke (CI, tests, debugging)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from provision.floor import exitcodes
from scripts.testmatrix.schema import MAX_WORKERS, MatrixError


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    if value > MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"{value} is above {MAX_WORKERS}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.testmatrix")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="repository root")
    parser.add_argument("--file", type=Path, default=None, help="matrix file (ROOT/matrix.yaml)")
    parser.add_argument("--lane", action="append", help="lane(s) to run; repeat or comma list")
    parser.add_argument("--list", action="store_true", help="show the plan, run nothing")
    parser.add_argument("--platform", help="force a named capability profile (dry run)")
    parser.add_argument("--json", type=Path, help="write the JSON summary here (- for stdout)")
    parser.add_argument("--junit-dir", type=Path, help="junit XML per lane (out/matrix/junit)")
    parser.add_argument("--out-dir", type=Path, help="logs and results (ROOT/out/matrix)")
    parser.add_argument(
        "--workers", type=_positive_int, help="override every lane's workers (measuring)"
    )
    parser.add_argument("--require", action="append", help="fail if this lane cannot run")
    parser.add_argument(
        "--rerun-failed", action="store_true", help="rerun what failed in the last run"
    )
    args = parser.parse_args(argv)
    from scripts.testmatrix.request import MatrixRun, UsageError
    from scripts.testmatrix.runner import run_matrix

    root = args.root.resolve()
    run = MatrixRun(
        root=root,
        matrix_file=args.file or root / "matrix.yaml",
        lanes=args.lane,
        platform=args.platform,
        list_only=args.list,
        json_path=args.json,
        junit_dir=args.junit_dir,
        out_dir=args.out_dir,
        workers=args.workers,
        require=args.require,
        rerun_failed=args.rerun_failed,
    )
    try:
        return run_matrix(run)
    except (MatrixError, UsageError) as err:
        print(f"error: {err}", file=sys.stderr)
        return exitcodes.USAGE
    except KeyboardInterrupt:
        print("[matrix] interrupted before any lane ran; nothing to report", file=sys.stderr)
        return exitcodes.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())

"""The repository root, stand-in builds, fresh interpreters: shared by every lane."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # tests/support/ -> the repository
STANDINS = ROOT / "tests" / "standins"


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str


def run_python(
    code: str, env: dict[str, str] | None = None, timeout: float = 120.0, cwd: Path | None = None
) -> Completed:
    """Run `code` in a fresh interpreter (real process exit, real library teardown)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=full_env,
        cwd=str(cwd or ROOT),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Completed(proc.returncode, proc.stdout, proc.stderr)


def build_shared_library(source: Path, out_dir: Path, name: str, extra: list[str] = ()) -> Path:
    """Compile one C file into a shared library with the system compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler: install gcc to build the test stand-ins")
    target = out_dir / name
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-o", str(target), str(source), *extra, "-ldl"],
        check=True,
        capture_output=True,
    )
    return target

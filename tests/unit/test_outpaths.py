"""Output paths are checked by really creating a file, not by permission bits alone: root passes
every os.access() check, yet cannot create files in /proc (or on a read-only mount)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from provision.floor import outpaths

REPO = Path(__file__).resolve().parents[2]
UNWRITABLE = Path("/proc/torch-fl-report.json")  # no one creates files here, root included


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux /proc")
def test_a_directory_no_one_can_write_is_refused() -> None:
    assert "not writable" in (outpaths.file_problem(UNWRITABLE) or "")
    assert "not writable" in (outpaths.dir_problem(UNWRITABLE.parent / "junit") or "")


def test_a_writable_directory_passes_and_is_left_as_it_was(tmp_path: Path) -> None:
    assert outpaths.file_problem(tmp_path / "r.json") is None
    assert outpaths.dir_problem(tmp_path / "new" / "junit") is None
    assert list(tmp_path.iterdir()) == []  # the probe file is gone, nothing was created


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize(
    "argv",
    [
        ["cache.list", "--json", str(UNWRITABLE)],
        ["provision", "--dry", "--only", "envfile", "--json", str(UNWRITABLE)],
        ["test", "--lane", "lint", "--json", str(UNWRITABLE)],
    ],
)
def test_tasks_refuse_an_unwritable_report_path_with_exit_2(
    tmp_path: Path, argv: list[str]
) -> None:
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "PATH": "/usr/bin:/bin"}
    run = subprocess.run(
        [sys.executable, "-m", "invoke", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert "not writable" in run.stderr and "Traceback" not in run.stderr

"""Helpers shared by the board-emu tests (imported by module name: pytest puts tests/lab first)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import NamedTuple

from provision.target import Target
from scripts import lab as lab_pkg

REPO = Path(__file__).resolve().parents[2]
PAGE_SIZE = lab_pkg.DEFAULT_PAGE_SIZE
EXPECTED_PAGE = {"16k": 16384, "64k": 65536}[PAGE_SIZE]


class Ran(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def guest(board: Target, command: str, timeout: float = 120.0) -> Ran:
    """Run a shell command on the lab through its `Target` (real SSH, real sshd)."""
    return Ran(*board.run(command, timeout=timeout))


def put(board: Target, local: Path, remote: str, mode: str = "755") -> None:
    board.put(local, remote)
    res = guest(board, f"chmod {mode} {shlex.quote(remote)}")
    assert res.returncode == 0, res.stderr


def box64_version(board: Target, path: str = "box64") -> str:
    res = guest(board, f"BOX64_NOBANNER=1 {path} -v 2>&1")
    return res.stdout.strip()

"""Helpers shared by the board-emu tests (imported by module name: pytest puts tests/lab first)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from scripts import lab as lab_pkg  # noqa: E402
from scripts.lab import vm  # noqa: E402

PAGE_SIZE = lab_pkg.DEFAULT_PAGE_SIZE
EXPECTED_PAGE = {"16k": 16384, "64k": 65536}[PAGE_SIZE]


def guest(info: vm.LabInfo, command: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """Run a shell command on the lab over SSH (real ssh client, real sshd)."""
    return vm.ssh_run(info, command, timeout=timeout)


def box64_version(info: vm.LabInfo, path: str = "box64") -> str:
    res = guest(info, f"BOX64_NOBANNER=1 {path} -v 2>&1")
    return res.stdout.strip()

"""Fixtures for the provision lane: isolated HOME/XDG dirs and a real OpenSSH server on loopback
(both from tests/support/sshd.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.sshd import SshServer, isolated_env

REPO = Path(__file__).resolve().parents[2]
STANDINS = REPO / "tests" / "standins" / "box64"


def run_provision(
    env: dict[str, str], *args: str, timeout: float = 900
) -> subprocess.CompletedProcess:
    """`invoke provision ARGS` through invoke's real CLI, as a separate process."""
    cmd = [sys.executable, "-m", "invoke", "--search-root", str(REPO / "provision"), "provision"]
    return subprocess.run(
        [*cmd, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def provision_cli():
    """Run `invoke provision ARGS` (a separate process, invoke's real CLI)."""
    return run_provision


@pytest.fixture
def iso(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    return tmp_path, isolated_env(tmp_path)


@pytest.fixture
def fast_config(tmp_path: Path) -> Path:
    """Skips torch-fl's own install and proof (torch_env, torch_fl, build_verify): covered
    separately (test_board_library.py, test_local_run.py), they take minutes."""
    path = tmp_path / "fast.yaml"
    path.write_text("steps:\n  skip: [torch_env, torch_fl, build_verify]\n", encoding="utf-8")
    return path


@pytest.fixture
def password_only_sshd(tmp_path: Path):
    """An sshd that refuses keys and offers only passwords (a freshly flashed board's default)."""
    server = SshServer(
        tmp_path / "sshd-password",
        first_config="PubkeyAuthentication no\nPasswordAuthentication yes\n",
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def sshd(tmp_path: Path):
    server = SshServer(tmp_path / "sshd")
    try:
        yield server
    finally:
        server.stop()

"""Farm fixtures: a real labgrid coordinator + exporter on 127.0.0.1 and real sshd "boards".

Nothing here skips. labgrid missing, a coordinator that does not start, a board that cannot be
built: each is a test error, so the farm lanes can never turn "all skipped, green".
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scripts.farm.emu import Board, EmuFarm
from tests.support.sshd import SshServer, isolated_env

REPO = Path(__file__).resolve().parents[2]
# Provisioning the boards is not what these tests are about: only the fast, host-independent
# steps run (box64 and the page-size probe are "not applicable" on an x86_64 board anyway).
FAST_STEPS = "steps:\n  skip: [x86_python, vendor_runtime, torch_env, torch_fl, build_verify]\n"


@pytest.fixture(autouse=True)
def _labgrid_installed():
    from scripts.farm import tools
    from scripts.farm.labgrid_client import FarmError

    try:
        tools.tool("labgrid-coordinator")
    except FarmError as exc:
        pytest.fail(str(exc))


def pytest_sessionfinish(session, exitstatus):
    """Zero passed tests in a farm run is an error, whatever pytest thought of it."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or exitstatus != 0:
        return
    if session.testscollected and not reporter.stats.get("passed"):
        session.exitstatus = 1


class SshBoards:
    """sshd servers standing in for x86_64 boards, and a farm config that reaches them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.servers: list[SshServer] = []

    def add(self, name: str) -> SshServer:
        server = SshServer(self.root / name)
        self.servers.append(server)
        return server

    def board(self, server: SshServer, name: str, **tags: str) -> Board:
        tags = {"arch": "x86_64", "pagesize": "4096", **tags}
        return Board(name, "127.0.0.1", server.port, server.user, tags)

    def known_hosts(self, extra: str = "") -> Path:
        path = self.root / "known_hosts"
        lines = [f"[127.0.0.1]:{s.port} {' '.join(s.host_pub.split()[:2])}\n" for s in self.servers]
        path.write_text("".join(lines) + extra)
        return path

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture
def ssh_boards(tmp_path: Path):
    boards = SshBoards(tmp_path / "boards")
    try:
        yield boards
    finally:
        boards.stop()


@pytest.fixture
def farm_factory(tmp_path: Path):
    farms: list[EmuFarm] = []

    def make(boards: list[Board]) -> EmuFarm:
        farm = EmuFarm(tmp_path / f"farm{len(farms)}", boards)
        farms.append(farm)
        farm.start()
        return farm

    try:
        yield make
    finally:
        for farm in farms:
            farm.stop()


def farm_yaml(path: Path, farm: EmuFarm, places: dict[str, dict[str, str]], known: Path) -> Path:
    """The --farm-config file: per-place identity, one known_hosts for all."""
    import yaml

    doc = {
        "coordinator": farm.address,
        "ssh": {"known_hosts": str(known)},
        "places": {name: {"ssh": ssh} for name, ssh in places.items()},
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def farm_cli(tmp_path: Path):
    """Run `invoke farm.<task> ARGS` through invoke's real CLI in an isolated home."""
    env = isolated_env(tmp_path / "controller")
    env.pop("LG_COORDINATOR", None)
    fast = tmp_path / "fast.yaml"
    fast.write_text(FAST_STEPS)

    def run(task: str, *args: str, timeout: float = 600, extra_env: dict | None = None):
        argv = [sys.executable, "-m", "invoke", "--search-root", str(REPO), f"farm.{task}"]
        if "--config" not in args:
            args = (*args, "--config", str(fast))
        proc = subprocess.run(
            [*argv, *args],
            cwd=REPO,
            env={**env, **(extra_env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        print(proc.stdout, proc.stderr, sep="\n")
        return proc

    return run

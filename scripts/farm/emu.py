"""A throwaway labgrid farm on this machine: a coordinator on 127.0.0.1 and an exporter.

Used by the farm-emu tests and the parallel-provisioning benchmark; also handy by hand
(docs/farm.md). Every process is started here, in its own session, and stopped by its PID.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from scripts.farm.labgrid_client import FarmError, LabgridClient

LAB_EXPORTER_CONFIG = Path(__file__).resolve().parents[1] / "lab" / "labgrid-exporter.yaml"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _binary(name: str) -> str:
    local = Path(sys.executable).with_name(name)
    if not local.is_file():
        raise FarmError(f"{name} is missing: `.venv/bin/pip install -r requirements-farm.txt`")
    return str(local)


@dataclass
class Board:
    """A place to publish: its group name, sshd address and tags."""

    name: str
    address: str
    port: int
    username: str
    tags: dict[str, str]


class _Process:
    def __init__(self, argv: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None):
        self.log_path = log
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()

    def tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]


class EmuFarm:
    """Coordinator + one exporter publishing `boards`, each made a place with its tags."""

    def __init__(self, workdir: Path, boards: list[Board], exporter: str = "farm-emu") -> None:
        self.workdir = workdir
        self.boards = boards
        self.exporter_name = exporter
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.coordinator: _Process | None = None
        self.exporter: _Process | None = None

    @property
    def client(self) -> LabgridClient:
        return LabgridClient(self.address)

    def exporter_config(self) -> str:
        groups = {
            b.name: {
                "NetworkService": {"address": b.address, "port": b.port, "username": b.username}
            }
            for b in self.boards
        }
        return yaml.safe_dump(groups, sort_keys=True)

    def start(self, timeout: float = 60.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        # The coordinator keeps places.yaml in its working directory: a fresh one per farm.
        self.coordinator = _Process(
            [_binary("labgrid-coordinator"), "-l", self.address],
            self.workdir,
            self.workdir / "coordinator.log",
        )
        self._wait(lambda: self._listening(), timeout, "the coordinator to listen")
        self.start_exporter(timeout)
        client = self.client
        for board in self.boards:
            client.run("-p", board.name, "create")
            client.run("-p", board.name, "add-match", f"{self.exporter_name}/{board.name}/*")
            client.run("-p", board.name, "set-tags", *(f"{k}={v}" for k, v in board.tags.items()))

    def start_exporter(self, timeout: float = 60.0) -> None:
        config = self.workdir / "exporter.yaml"
        config.write_text(self.exporter_config(), encoding="utf-8")
        self.exporter = _Process(
            [_binary("labgrid-exporter"), "-c", self.address, "-n", self.exporter_name,
             "--hostname", "127.0.0.1", str(config)],
            self.workdir,
            self.workdir / "exporter.log",
        )  # fmt: skip
        want = {f"{self.exporter_name}/{b.name}/NetworkService" for b in self.boards}
        self._wait(
            lambda: want <= set(self.client.run("resources").split()), timeout, "the exporter"
        )

    def _listening(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            return True
        except OSError:
            return False

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in (self.coordinator, self.exporter):
                if proc is not None and not proc.alive():
                    raise FarmError(f"waiting for {what}: a farm process exited:\n{proc.tail()}")
            try:
                if ready():
                    return
            except FarmError:
                pass
            time.sleep(0.3)
        raise FarmError(f"timed out after {timeout:.0f}s waiting for {what}")

    def stop(self) -> None:
        for proc in (self.exporter, self.coordinator):
            if proc is not None:
                proc.stop()

    def __enter__(self) -> EmuFarm:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

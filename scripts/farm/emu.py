"""A throwaway labgrid farm on this machine: a coordinator on 127.0.0.1 and an exporter.

Used by the farm-emu tests and the parallel-provisioning benchmark; also handy by hand
(docs/farm.md). Every process is started here, in its own session, and stopped by its PID.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
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
    from scripts.farm import tools

    return tools.tool(name)


@dataclass
class Board:
    """A place to publish: its group name, sshd address and tags."""

    name: str
    address: str
    port: int
    username: str
    tags: dict[str, str]
    extra: dict | None = None  # more resources of the group, e.g. a NetworkPowerPort


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
                "NetworkService": {"address": b.address, "port": b.port, "username": b.username},
                **(b.extra or {}),
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


class PrivateLab:
    """A second, throwaway instance of the emulated board, booted from the lab's cached
    kernel and root file system (never building them), with its own state directory.

    Provisioning changes the guest (box64 upgraded, env file written); a private instance keeps
    that away from a lab someone else is using, and stopping it restores nothing anyone needs.
    """

    def __init__(self, workdir: Path, page_size: str | None = None, image: str = "board") -> None:
        self.workdir = workdir
        self.page_size = page_size
        self.image = image
        self.info = None
        self._saved: str | None = None

    def _enter_cache(self) -> None:
        self._saved = os.environ.get("TORCH_FL_LAB_CACHE")
        os.environ["TORCH_FL_LAB_CACHE"] = str(self.workdir)

    def _leave_cache(self) -> None:
        if self._saved is None:
            os.environ.pop("TORCH_FL_LAB_CACHE", None)
        else:
            os.environ["TORCH_FL_LAB_CACHE"] = self._saved

    def start(self):
        from scripts import lab
        from scripts.lab import cache, kernel, rootfs, vm

        page_size = self.page_size or lab.DEFAULT_PAGE_SIZE
        shared = cache.cache_root()
        self.workdir.mkdir(parents=True, exist_ok=True)
        for product in shared.glob("*-*"):
            if (product / cache.DONE_MARKER).is_file() and not product.name.startswith("apt"):
                link = self.workdir / product.name
                if not link.exists():
                    link.symlink_to(product)
        self._enter_cache()
        try:
            if kernel.cached(page_size) is None or rootfs.cached(self.image) is None:
                raise FarmError(
                    f"the lab's {page_size} kernel or {self.image!r} root file system is not "
                    f"built yet in {shared}: run `invoke lab.up --image {self.image}` once (it "
                    "builds and caches them)"
                )
            self.info, _ = vm.up(page_size, log=lambda msg: None, image_name=self.image)
        finally:
            self._leave_cache()
        return self.info

    def stop(self) -> None:
        from scripts.lab import vm

        self._enter_cache()
        try:
            vm.down()
        finally:
            self._leave_cache()

"""labgrid's coordinator through its own command line (`labgrid-client`), one call per process.

The CLI is labgrid's stable interface; driving it as a subprocess keeps labgrid's asyncio/gRPC
machinery out of this process, so one thread per place can hold a place without sharing an
event loop. Resource lookups that need labgrid's Python API run in a child too
(`python -m scripts.farm.resolve`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts.farm import tools
from scripts.farm.errors import FarmError

_TOKEN = re.compile(r"LG_TOKEN=([A-Z0-9]+)")
_ACQUIRED = re.compile(r"^acquired place (\S+)$", re.MULTILINE)
_PLACE = re.compile(r"^Place '([^']+)':", re.MULTILINE)
TAG = re.compile(r"^[a-z][a-z0-9_]*=[A-Za-z0-9_.:-]+$")


def client_binary() -> str:
    return tools.tool("labgrid-client")


@dataclass
class LabgridClient:
    coordinator: str
    env: dict[str, str] = field(default_factory=dict)  # e.g. LG_USERNAME for another identity
    timeout_s: float = 30.0

    def _environ(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("LG_TOKEN", None)  # a token in the caller's shell must not pick our place
        env.pop("LG_PLACE", None)
        env.update(self.env)
        env["LG_COORDINATOR"] = self.coordinator
        return env

    def run(self, *args: str, timeout: float | None = None, check: bool = True) -> str:
        argv = [client_binary(), "-x", self.coordinator, *args]
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=timeout or self.timeout_s,
                env=self._environ(),
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            raise FarmError(
                f"labgrid-client {' '.join(args)} did not answer within {exc.timeout:.0f}s "
                f"(coordinator {self.coordinator})"
            ) from None
        if check and proc.returncode != 0:
            tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["(no output)"]
            raise FarmError(f"labgrid-client {' '.join(args)} failed: {tail[0][:300]}")
        return proc.stdout

    # -- places -----------------------------------------------------------------------------

    def places(self) -> list[str]:
        return [ln.split()[0] for ln in self.run("places").splitlines() if ln.strip()]

    def show(self, place: str) -> str:
        return self.run("-p", place, "show")

    # -- reservations and locks -------------------------------------------------------------

    def reserve(self, filters: dict[str, str]) -> str:
        """Create a reservation (not waiting for it); return its token."""
        pairs = [f"{k}={v}" for k, v in filters.items()]
        out = self.run("reserve", "--shell", *pairs)
        match = _TOKEN.search(out)
        if not match:
            raise FarmError(f"labgrid-client reserve printed no token: {out.strip()[:200]}")
        return match.group(1)

    def wait(self, token: str, timeout: float) -> None:
        """Block until the reservation is allocated; FarmError after `timeout` seconds."""
        try:
            self.run("wait", token, timeout=timeout)
        except FarmError as exc:
            if "did not answer" in str(exc):
                raise FarmError(
                    f"no place matching the reservation became free within {timeout:.0f}s "
                    "(held by someone else, or no such place: see `labgrid-client who`)"
                ) from None
            raise

    def acquire(self, token: str) -> str:
        """Acquire the place a reservation was allocated; return the place's name."""
        match = _ACQUIRED.search(self.run("-p", f"+{token}", "acquire"))
        match = match or _PLACE.search(self.run("-p", f"+{token}", "show"))
        if not match:
            raise FarmError(f"cannot tell which place reservation {token} holds")
        return match.group(1)

    def release(self, place: str) -> None:
        self.run("-p", place, "release")

    def cancel(self, token: str) -> None:
        self.run("cancel-reservation", token)

    def reservations(self) -> list[dict[str, str]]:
        """Current reservations as {token, state, owner}."""
        out = self.run("reservations")
        found: list[dict[str, str]] = []
        for line in out.splitlines():
            head = re.match(r"^Reservation '([^']+)':", line)
            if head:
                found.append({"token": head.group(1)})
            elif found and ":" in line:
                key, _, value = line.strip().partition(":")
                if key in ("state", "owner"):
                    found[-1][key] = value.strip()
        return found

    def resolve(self, place: str, timeout: float = 60.0) -> dict[str, Any]:
        """The place's resources (NetworkService, optional power/serial) via labgrid's API."""
        argv = [tools.python(), "-m", "scripts.farm.resolve", place]
        root = str(Path(__file__).resolve().parents[2])
        env = self._environ()
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        try:
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=root
            )
        except subprocess.TimeoutExpired:
            raise FarmError(f"resolving place {place} took over {timeout:.0f}s") from None
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            tail = (proc.stderr.strip().splitlines() or [f"rc {proc.returncode}"])[-1]
            raise FarmError(f"resolving place {place} failed: {tail[:300]}")
        return json.loads(lines[-1])

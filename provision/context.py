"""What a provisioning step works with: the target, its facts, the configuration, the options.

Steps talk to the target only through the `Context` (commands, transfers, completion markers),
so the same step code provisions this machine and a board over SSH.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from provision.results import CheckResult, Inputs, StepError
from provision.settings import Settings
from provision.target import Target


@dataclass
class Options:
    artifacts: Path | None = None
    oe_wheels: Path | None = None
    dry: bool = False


@dataclass
class Context:
    target: Target
    facts: dict[str, Any]
    config: Settings  # provision.yaml with its overrides, typed (provision/settings.py)
    options: Options
    log_dir: Path
    work_dir: Path  # controller-side scratch (downloads, probe build)
    recorded_artifacts: list[dict[str, str]] = field(default_factory=list)
    echo: Callable[[str], None] = print

    @property
    def arch(self) -> str:
        return str(self.facts.get("arch", ""))

    @property
    def prefix(self) -> str:
        return self.expand(self.config.prefix)

    def expand(self, text: str) -> str:
        return text.format(
            data_home=self.facts.get("data_home", ""),
            cache_home=self.facts.get("cache_home", ""),
            config_home=self.facts.get("config_home", ""),
            home=self.facts.get("home", ""),
        )

    def sh(self, cmd: str, timeout: float = 120.0) -> tuple[int, str, str]:
        return self.target.run(cmd, timeout=timeout)

    def sudo(self) -> str:
        """Prefix for privileged commands: none as root, sudo -n otherwise (never prompts)."""
        if self.facts.get("uid") == 0:
            return ""
        if self.facts.get("sudo"):
            return "sudo -n "
        raise StepError("this needs root and the target has no sudo; run as root or install sudo")

    def run_long(self, step: str, cmd: str, timeout: float) -> tuple[int, Path]:
        """A long command: output to a log file here, progress to the console."""
        log = self.log_dir / f"{step}-{time.strftime('%Y%m%d-%H%M%S')}.log"
        self.echo(f"  [{step}] running (log: {log})")
        rc = self.target.run_logged(
            cmd, log, timeout=timeout, progress=lambda msg: self.echo(f"  [{step}] {msg}")
        )
        return rc, log

    def read_marker(self, path: str) -> dict[str, Any] | None:
        rc, out, _ = self.sh(f"cat {shlex.quote(path)} 2>/dev/null")
        if rc != 0:
            return None
        try:
            data = json.loads(out)
        except ValueError:
            return None
        return data if isinstance(data, dict) and data.get("complete") is True else None

    def write_file_atomic(self, path: str, text: str) -> None:
        """Write `text` to `path` on the target: ship to `path.tmp`, then rename.

        A rename within one directory is atomic, so a reader (torch_fl reading the env file, a
        later run reading a marker) never sees a half-written file.
        """
        self.work_dir.mkdir(parents=True, exist_ok=True)
        local = self.work_dir / f"atomic-{time.monotonic_ns()}"
        local.write_text(text, encoding="utf-8")
        remote_tmp = f"{path}.tmp"
        self.target.put(local, remote_tmp)
        local.unlink()
        rc, _, err = self.sh(f"mv -f {shlex.quote(remote_tmp)} {shlex.quote(path)}")
        if rc != 0:
            raise StepError(f"writing {path} failed: {err.strip()}")

    def write_marker(self, path: str, data: dict[str, Any]) -> None:
        """Completion markers are written last and atomically: a marker means a finished install."""
        self.write_file_atomic(
            path, json.dumps({**data, "complete": True}, indent=1, sort_keys=True)
        )


class Step(Protocol):
    """A read-only `check` and an `apply` that makes the target match.

    `check` observes and returns a CheckResult (ok / needed / failed, the facts it saw, a detail
    line); it may run programs but changes nothing that a later run depends on. `apply` makes the
    target match; the plan re-checks afterwards instead of trusting apply. `requires` names the
    steps whose results (`Inputs`) the step reads; the plan supplies them.
    """

    name: str
    title: str
    requires: tuple[str, ...]

    def check(self, ctx: Context, inputs: Inputs) -> CheckResult: ...

    def apply(self, ctx: Context, before: CheckResult, inputs: Inputs) -> None: ...

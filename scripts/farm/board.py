"""What the farm does on a board, over the project's SSH target: ship the checkout, give it a
Python that can run the matrix, run lanes there, and bring the results back.

The lanes run *on the board*, so the board's own capability detection decides what runs and
which matrix expectations apply. How the board gets its Python (`setup`):

- `bootstrap`: `scripts/bootstrap.sh` on the board (pip, the pinned set, the extension): a real
  board with network access. Where provisioning made the board's torch-fl environment (the
  torch_env and torch_fl steps), bootstrap completes that one instead: its torch and its
  torch-fl, built on the board, stay; the lanes' tools come from `requirements-board.txt`
  (from the shipped wheelhouse only, when the job had `--artifacts`); and the checkout goes
  without `torch_fl/` and `csrc/`, so the lanes import the library the board installed.
- `kit`: the controller ships the pure-Python test tools from its own environment (pytest and
  its plugins, PyYAML without its C part, invoke) and the board's `python3` runs them: a board
  with no network, such as the emulated one.
- `none`: the board already has a working environment (`--board-python`).
"""

from __future__ import annotations

import importlib.metadata as md
import io
import re
import shlex
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision.target import Target

SETUP_MODES = ("bootstrap", "kit", "none")
# The matrix runner needs these on the board; the rest of each closure follows from metadata.
KIT_ROOTS = ("pytest", "pytest-xdist", "pytest-timeout", "PyYAML", "invoke")
REMOTE_DIR = "torch-fl/farm"  # under the board user's cache directory


class BoardError(RuntimeError):
    """A step on the board failed; the message says which and why."""


# What a board whose environment has torch-fl installed does not get: the library's own sources
# would shadow the installed package (the lanes run from the checkout's root).
LIBRARY_DIRS = ("torch_fl", "csrc")


def checkout_tarball(root: Path, without: tuple[str, ...] = ()) -> bytes:
    """The checkout as git sees it (tracked + untracked, not ignored): no venv, no build output;
    top-level directories in `without` are left out."""
    proc = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in sorted(set(proc.stdout.decode().split("\0")) - {""}):
            if name.split("/", 1)[0] in without:
                continue
            path = root / name
            if path.is_file():
                tar.add(path, arcname=name, recursive=False)
    return buf.getvalue()


def _requirement_names(dist: md.Distribution) -> list[str]:
    names = []
    for req in dist.requires or []:
        if "extra ==" in req:
            continue
        names.append(re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0])
    return names


def kit_tarball() -> tuple[bytes, list[str]]:
    """Pure-Python files of KIT_ROOTS and their dependencies, from this interpreter's install."""
    todo, seen, dists = list(KIT_ROOTS), set(), []
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            if name in KIT_ROOTS[:1]:
                raise BoardError(f"the controller lacks {name}; run scripts/bootstrap.sh") from None
            continue  # an optional root (pytest-timeout) or a marker-only dependency
        dists.append(dist)
        todo += _requirement_names(dist)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for dist in dists:
            for file in dist.files or []:
                parts = file.parts
                # compiled modules belong to the controller's CPU and Python; byte code is rebuilt
                if "__pycache__" in parts or file.suffix in (".so", ".pyd", ".pyc"):
                    continue
                # console scripts live outside site-packages (../../bin): the kit runs modules
                if parts[0] == ".." or file.is_absolute():
                    continue
                path = Path(str(file.locate()))
                if path.is_file():
                    tar.add(path, arcname=str(file), recursive=False)
    return buf.getvalue(), sorted(f"{d.metadata['Name']}=={d.version}" for d in dists)


@dataclass(frozen=True)
class BoardEnv:
    """The torch-fl environment provisioning made on a board (torch_env + torch_fl steps)."""

    venv: str  # the venv's directory
    wheels: str = ""  # the wheelhouse shipped beside it ('' when the job had none)


class Board:
    """One board's working directory and the commands run there."""

    def __init__(self, target: Target, log: Path, echo: Callable[[str], None] = print) -> None:
        self.target = target
        self.log = log
        self.echo = echo
        rc, out, err = target.run('printf %s "${XDG_CACHE_HOME:-$HOME/.cache}"', timeout=30)
        if rc != 0 or not out.startswith("/"):
            raise BoardError(f"cannot find the cache directory on {target.name}: {err.strip()}")
        self.base = f"{out}/{REMOTE_DIR}"
        self.checkout = f"{self.base}/checkout"
        self.kit = f"{self.base}/kit"

    def _sh(self, cmd: str, timeout: float, what: str) -> str:
        rc, out, err = self.target.run(cmd, timeout=timeout)
        if rc != 0:
            raise BoardError(f"{what} failed on {self.target.name} (rc {rc}): {err.strip()[-300:]}")
        return out

    def _ship(self, data: bytes, dest: str, what: str) -> None:
        with tempfile.NamedTemporaryFile(suffix=".tar.gz") as tmp:
            tmp.write(data)
            tmp.flush()
            remote = f"{self.base}/{Path(dest).name}.tar.gz"
            self.target.put(Path(tmp.name), remote)
        q = shlex.quote
        # Unpacked next to the old copy and swapped in: a stale file never survives a run.
        self._sh(
            f"rm -rf {q(dest)}.new && mkdir -p {q(dest)}.new && tar -xzf {q(remote)} -C "
            f"{q(dest)}.new && rm -rf {q(dest)} && mv {q(dest)}.new {q(dest)} && rm -f {q(remote)}",
            timeout=300,
            what=what,
        )

    def ship_checkout(self, root: Path, without: tuple[str, ...] = ()) -> None:
        self._ship(checkout_tarball(root, without), self.checkout, "unpacking the checkout")

    def setup(
        self, mode: str, board_python: str | None, board_env: BoardEnv | None = None
    ) -> tuple[str, dict[str, str]]:
        """Prepare the board's Python; return (python command, extra environment).

        `board_env`: the environment provisioning made there, which `bootstrap` completes."""
        q = shlex.quote
        if mode == "bootstrap":
            venv = f"{self.base}/venv"
            # FARM=0: the board runs lanes, it never talks to the coordinator itself. SYSTEM=0:
            # the controller's host packages (qemu, the lab's tools) are not the board's; what the
            # board needs, provisioning installed.
            knobs = f"FARM=0 SYSTEM=0 VENV={q(venv)}"
            if board_env is not None:
                venv = board_env.venv
                knobs = (
                    f"FARM=0 SYSTEM=0 ZOO=0 VENV={q(venv)} TORCH=keep EXTENSION=installed "
                    "REQUIREMENTS=requirements-board.txt"
                )
                if board_env.wheels:
                    # An offline board: the wheelhouse provisioning shipped, and no index.
                    knobs += f" PIP_NO_INDEX=1 PIP_FIND_LINKS={q(board_env.wheels)}"
                self.echo(f"bootstrap: completing the provisioned environment {venv}")
            rc = self.target.run_logged(
                f"cd {q(self.checkout)} && {knobs} scripts/bootstrap.sh",
                self.log,
                timeout=7200,
                progress=lambda m: self.echo(f"  [bootstrap] {m}"),
            )
            if rc != 0:
                raise BoardError(f"scripts/bootstrap.sh failed (rc {rc}); see {self.log}")
            return f"{venv}/bin/python", {}
        if mode == "kit":
            data, names = kit_tarball()
            self._ship(data, self.kit, "unpacking the test kit")
            self.echo(f"test kit: {', '.join(names)}")
            python = board_python or "python3"
            return python, {"PYTHONPATH": self.kit}
        if mode == "none":
            return board_python or "python3", {}
        raise BoardError(f"unknown setup {mode!r}; use one of {', '.join(SETUP_MODES)}")

    def run_lanes(
        self,
        python: str,
        env: dict[str, str],
        lanes: list[str],
        matrix_file: str,
        timeout: float,
    ) -> int:
        """`python -m scripts.testmatrix` for the lanes, on the board; returns its exit code."""
        q = shlex.quote
        out = f"{self.checkout}/out/farm"
        paths = ":".join([env["PYTHONPATH"], self.checkout] if "PYTHONPATH" in env else [])
        prefix = f"PYTHONPATH={q(paths)} " if paths else ""
        cmd = (
            f"cd {q(self.checkout)} && rm -rf out/farm && {prefix}{q(python)} -m scripts.testmatrix"
            f" --root . --file {q(matrix_file)} --lane {q(','.join(lanes))}"
            f" --json {q(out)}/summary.json --junit-dir {q(out)}/junit --out-dir {q(out)}"
        )
        started = time.monotonic()
        rc = self.target.run_logged(
            cmd, self.log, timeout=timeout, progress=lambda m: self.echo(f"  [lanes] {m}")
        )
        self.echo(f"lanes finished on the board: rc {rc} in {time.monotonic() - started:.1f}s")
        return rc

    def fetch(self, dest: Path) -> dict[str, Any]:
        """Copy summary.json, junit XML and lane logs to `dest`; return what arrived."""
        out = f"{self.checkout}/out/farm"
        rc, listing, _ = self.target.run(
            f"cd {shlex.quote(out)} 2>/dev/null && "
            "ls summary.json junit/*.xml logs/*.log results/*.jsonl 2>/dev/null",
            timeout=60,
        )
        files = [ln.strip() for ln in listing.splitlines() if ln.strip()]
        got: dict[str, Any] = {"summary": None, "junit": [], "logs": [], "results": []}
        for name in files:
            local = dest / name
            self.target.get(f"{out}/{name}", local)
            if name == "summary.json":
                got["summary"] = local
            elif name.startswith("junit/"):
                got["junit"].append(local)
            elif name.startswith("results/"):
                got["results"].append(local)  # the per-test records, for a delegated lane
            else:
                got["logs"].append(local)
        return got

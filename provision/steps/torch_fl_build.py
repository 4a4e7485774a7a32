"""torch-fl itself in the board's environment: built there, or its wheel from an earlier board.

Why build on the board and not on the controller: the extension must be compiled against the
exact torch the board imports (its ABI and the C++ standard its headers demand, which differ
between PyPI's torch 2.13 and Debian's 2.14) for aarch64; cross-compiling on the x86_64
controller would need that torch's aarch64 headers and libraries, i.e. the board's own
environment. So the first board of a kind builds a wheel (about 11 minutes on the emulated
board's two cores, docs/provisioning.md), the controller keeps it, keyed by the source's sha256,
torch's version and ABI, the Python tag and the CPU, and every later board with the same key
installs that wheel in seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import signal
from pathlib import Path
from typing import Any

from provision import artifacts, scratch, sources
from provision.context import Context
from provision.results import (
    NEEDED,
    OK,
    CheckResult,
    Inputs,
    StepError,
    TorchFlFound,
    not_applicable,
)
from provision.steps.prereqs import apt_install
from provision.steps.torch_env import LOCAL_ONLY

MARKER = ".complete.json"
TARBALL = "torch-fl-src.tar.gz"
_KEY_SNIPPET = (
    "import json, platform, sys, torch; print('TFL_KEY ' + json.dumps([sys.implementation."
    "cache_tag, platform.machine(), torch.__version__, bool(torch._C._GLIBCXX_USE_CXX11_ABI)]))"
)
_IMPORT_SNIPPET = "import json, torch_fl; print('TFL_LIB ' + json.dumps(torch_fl.build_info()))"


def root_dir(ctx: Context) -> str:
    return f"{ctx.prefix}/torch-fl"


def wheel_cache() -> Path:
    """The controller's wheels, shared by every board it provisions (not per host)."""
    return scratch.controller_cache() / "torch-fl-wheels"


def _tagged(ctx: Context, python: str, snippet: str, tag: str) -> tuple[Any, str]:
    clean = "env -u PYTHONPATH -u PYTHONHOME TORCH_DEVICE_BACKEND_AUTOLOAD=0"
    rc, out, err = ctx.sh(f"{clean} {shlex.quote(python)} -c {shlex.quote(snippet)}", timeout=600)
    for line in out.splitlines():
        if line.startswith(f"{tag} "):
            return json.loads(line[len(tag) + 1 :]), line
    return None, (out + err).strip()[-400:]


def installed(ctx: Context, python: str) -> tuple[dict[str, Any] | None, str]:
    """torch_fl.build_info() as the board's python reports it, or why it does not import."""
    return _tagged(ctx, python, _IMPORT_SNIPPET, "TFL_LIB")


def build_error(log: Path) -> str:
    """The line of a failed build's log that says why: setup.py's own refusal (a missing header
    or tool, named with its fix), else the compiler's first error, else the signal that killed
    the build, else the generic hint."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines()]
    except OSError:
        lines = []
    for marker in ("error: cannot build torch_fl", "fatal error:", "error:"):
        found = next((ln for ln in lines if marker in ln and "subprocess-exited" not in ln), None)
        if found:
            return found[:400]
    killer = killed_by(log)
    if killer is not None:
        return f"the build was killed by {_signal_name(killer)}"
    return "a C++ compiler, the Python headers and torch's C++ headers are needed there"


BUILD_ATTEMPTS = 2
"""A build whose backend a signal killed is tried once more: under the emulated board's qemu
(TCG) the build backend died once at its start with SIGILL (pip: "exit code: -4", no output),
and the same tree built there on the next try and in every run before it. A real illegal
instruction or a kill by the OOM killer happens again and fails the second try the same way."""


def killed_by(log: Path) -> int | None:
    """The signal that killed a failed build's backend (pip reports it as a negative exit
    code), or None if it exited by itself."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    found = re.search(r"exit code: -(\d+)", text)
    return int(found.group(1)) if found else None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class TorchFlBuild:
    name = "torch_fl"
    title = "torch-fl built into the board's environment"
    requires = ("torch_env",)

    def check(self, ctx: Context, inputs: Inputs) -> CheckResult:
        if ctx.target.is_local:
            return not_applicable(LOCAL_ONLY)
        env = inputs.torch_env
        if env is None:
            return CheckResult(NEEDED, {}, "no torch environment yet (the torch_env step)")
        root = root_dir(ctx)
        source_sha = sources.sha256()
        facts: dict[str, Any] = {"root": root, "source_sha256": source_sha}
        marker = ctx.read_marker(f"{root}/{MARKER}")
        if marker is None:
            return CheckResult(NEEDED, facts, "torch-fl is not installed in the environment")
        if marker.get("source_sha256") != source_sha:
            return CheckResult(NEEDED, facts, "torch-fl's sources changed: rebuild")
        info, raw = installed(ctx, env.python)
        if info is None:
            return CheckResult(NEEDED, facts, f"torch_fl does not import: {raw}")
        built, running = info.get("torch_built_against"), info.get("torch_running", "")
        facts.update(build_info=info, wheel=marker.get("wheel"), built=marker.get("built"))
        if built is None or str(running).split("+")[0] != str(built).split("+")[0]:
            return CheckResult(NEEDED, facts, f"built against torch {built}, running {running}")
        detail = f"torch-fl on torch {running}, page size {info.get('page_size')}"
        return CheckResult(OK, facts, detail, TorchFlFound(env.python, str(running)))

    # -- apply -----------------------------------------------------------------------------
    def apply(self, ctx: Context, before: CheckResult, inputs: Inputs) -> None:
        env = inputs.torch_env
        if env is None:
            raise StepError("no torch environment on the target: run the torch_env step first")
        tarball = sources.write_tarball(ctx.work_dir / TARBALL)
        source_sha = artifacts.sha256_of(tarball)
        key, raw = _tagged(ctx, env.python, _KEY_SNIPPET, "TFL_KEY")
        if key is None:
            raise StepError(f"{env.python} does not import torch: {raw}")
        digest = hashlib.sha256(json.dumps([source_sha, *key]).encode()).hexdigest()[:32]
        cached = wheel_cache() / digest
        root = root_dir(ctx)
        ctx.sh(f"rm -rf {shlex.quote(root)} && mkdir -p {shlex.quote(root)}/dist")
        wheels = sorted(cached.glob("*.whl")) if cached.is_dir() else []
        if wheels:
            ctx.echo(f"  [{self.name}] installing the wheel built for {'/'.join(map(str, key))}")
            remote = artifacts.ship(ctx, wheels[0], f"{root}/dist")
            how = "cached wheel"
        else:
            remote = self.build_wheel(ctx, env.python, tarball, source_sha)
            self.keep_wheel(ctx, remote, cached)
            how = "built on the board"
        py = shlex.quote(env.python)
        cmd = f"{py} -m pip install --disable-pip-version-check --no-deps --force-reinstall "
        rc, log = ctx.run_long(self.name, cmd + shlex.quote(remote), timeout=600)
        if rc != 0:
            raise StepError(f"installing {remote} failed (rc {rc}); see {log}")
        info, raw = installed(ctx, env.python)
        if info is None:
            raise StepError(f"torch_fl was installed but does not import: {raw}")
        record = {"source_sha256": source_sha, "wheel": Path(remote).name, "built": how}
        ctx.write_marker(f"{root}/{MARKER}", {**record, "build_info": info})

    def build_wheel(self, ctx: Context, python: str, tarball: Path, sha: str) -> str:
        root = root_dir(ctx)
        self.build_tools(ctx, python)
        shipped = artifacts.ship(ctx, tarball, root, sha)
        r, py = shlex.quote(root), shlex.quote(python)
        cmd = (
            f"set -e; cd {r}; tar -xzf {shlex.quote(shipped)}; cd torch-fl; "
            # The venv's bin first: torch's BuildExtension compiles in parallel with its ninja.
            f'PATH="$(dirname {py}):$PATH" '
            f"env -u PYTHONPATH ACCELERATOR=bpu TORCH_DEVICE_BACKEND_AUTOLOAD=0 {py} -m pip wheel "
            f"--disable-pip-version-check --no-build-isolation --no-deps -w {r}/dist ."
        )
        timeout = ctx.config.torch_fl.build_timeout_s
        for attempt in range(1, BUILD_ATTEMPTS + 1):
            rc, log = ctx.run_long(self.name, cmd, timeout=timeout)
            killer = killed_by(log) if rc != 0 else None
            if killer is None or attempt == BUILD_ATTEMPTS:
                break
            ctx.echo(
                f"  [{self.name}] the build was killed by {_signal_name(killer)} "
                f"(attempt {attempt} of {BUILD_ATTEMPTS}); building again"
            )
        if rc != 0:
            raise StepError(
                f"building torch-fl on {ctx.target.name} failed (rc {rc}): {build_error(log)}; "
                f"see {log}"
            )
        rc, out, _ = ctx.sh(f"ls {r}/dist/*.whl")
        found = out.split()
        if rc != 0 or len(found) != 1:
            raise StepError(f"pip wheel left {len(found)} wheels in {root}/dist, expected one")
        return found[0]

    def build_tools(self, ctx: Context, python: str) -> None:
        """A C++ compiler and Python.h: boards ship neither by default."""
        headers = "import os, sysconfig; print(os.path.isfile(sysconfig.get_paths()['include'] + '/Python.h'))"
        rc, out, _ = ctx.sh(
            f"command -v c++ >/dev/null && {shlex.quote(python)} -c {shlex.quote(headers)}"
        )
        if rc == 0 and out.strip() == "True":
            return
        apt_install(ctx, self.name, ["g++", "python3-dev"])

    def keep_wheel(self, ctx: Context, remote: str, cached: Path) -> None:
        """Fetch the board's wheel into the controller's cache: a temp dir, then a rename."""
        tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        ctx.target.get(remote, tmp / Path(remote).name)
        try:
            tmp.replace(cached)
        except OSError:  # another board of the same kind got there first: theirs is the same
            for leftover in tmp.iterdir():
                leftover.unlink()
            tmp.rmdir()


STEP = TorchFlBuild()

"""Board-emu lane fixtures: one emulated board per session, provisioning run against it.

The lab is started once (cold: builds and caches kernel + rootfs; warm: seconds), always as a
fresh board (a running lab is restarted first), and stopped at the end unless it was already
running before the session. Where the lab cannot start, every
test here is skipped with the capability's reason, never passed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from lab_helpers import PAGE_SIZE, REPO

from scripts import lab as lab_pkg
from scripts.lab import vm, x86python

# torch for aarch64 is not in the lab's offline userland (no CPU torch for its Python there,
# docs/board-lab.md): the lane provisions box64, the page-size probe, the x86_64 Python with
# hbdk4 and the env file, what a large-page board decides; torch-fl's own install onto a board
# is the board-install lane's (over a loopback sshd).
SKIP_STEPS = ["torch_env", "torch_fl"]


@pytest.fixture(scope="session")
def lab() -> vm.LabInfo:
    ok, why = lab_pkg.capability(PAGE_SIZE)
    if not ok:
        pytest.skip(f"board lab unavailable: {why}")
    was_running = vm.running() is not None
    if was_running:
        # A lab left running may have been provisioned already (box64 upgraded); the lane
        # asserts what provisioning does to a fresh board. The guest lives in an initramfs, so
        # a restart is a fresh board (and, warm, takes seconds).
        print("lab: restarting the running lab for a fresh board", file=sys.stderr)
        vm.down()
    info, timings = vm.up(PAGE_SIZE, log=lambda msg: print(msg, file=sys.stderr))
    print(f"lab up ({PAGE_SIZE}): {timings}", file=sys.stderr)
    yield info
    if not was_running:
        vm.down()


@pytest.fixture(scope="session")
def board(lab: vm.LabInfo):
    """The running lab as a provisioning `Target`."""
    target = vm.target(lab)
    yield target
    target.close()


@pytest.fixture(scope="session")
def x86_python_tarball() -> tuple[Path, dict]:
    return x86python.ensure()


@pytest.fixture
def provision_on_lab(lab, x86_python_tarball, tmp_path_factory):
    """Run `invoke provision --host <lab>` (invoke's real CLI) and return (proc, report)."""
    tarball, meta = x86_python_tarball

    def run(*extra: str, config: dict | None = None, name: str = "run"):
        work = tmp_path_factory.mktemp(f"provision-{name}")
        artifacts = work / "artifacts"
        artifacts.mkdir()
        os.symlink(tarball, artifacts / tarball.name)
        cfg = {
            "ssh": {"known_hosts": str(lab.known_hosts), "identity": str(lab.identity)},
            "x86_python": {"source": "tarball", "tarball": x86python.provision_pin(meta)},
            "steps": {"skip": list(SKIP_STEPS)},
        }
        for key, value in (config or {}).items():
            cfg.setdefault(key, {}).update(value)
        (work / "config.yaml").write_text(yaml.safe_dump(cfg))
        env = dict(os.environ, XDG_CACHE_HOME=str(work / "cache"), PYTHONPATH=str(REPO))
        env.pop("FLAGOS_BPU_ENV_FILE", None)
        report = work / "report.json"
        argv = [sys.executable, "-m", "invoke", "provision", "--host", lab.host]
        argv += ["--config", str(work / "config.yaml"), "--artifacts", str(artifacts)]
        argv += ["--report", str(report), *extra]
        proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
        print(proc.stdout, proc.stderr, sep="\n", file=sys.stderr)
        doc = json.loads(report.read_text()) if report.is_file() else None
        return proc, doc

    return run

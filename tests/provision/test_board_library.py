"""torch-fl onto a board over SSH: its Python environment, the library built there, the proof.

The board is a real OpenSSH server on 127.0.0.1 (this x86_64 machine); the wheelhouse is what an
offline board gets with `--artifacts`: torch's wheel and every wheel torch-fl needs, downloaded
here by pip (from its cache or the wheel on disk, as scripts/bootstrap.sh installs them).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from provision.steps import torch_env, torch_fl_build

pytestmark = [pytest.mark.slow, pytest.mark.board_install]
STEPS = "torch_env,torch_fl,build_verify"


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """torch==2.13.0 and the pinned wheels with their dependencies, as files."""
    from provision import config

    cfg = config.load()
    house = tmp_path_factory.mktemp("wheelhouse")
    wanted = [f"torch=={cfg.torch_env.torch.version}", *cfg.torch_env.wheels]
    res = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q",
         "--only-binary=:all:", "-d", str(house), *wanted],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    return house


def _report(path: Path) -> dict:
    return json.loads(path.read_text())


def _step(doc: dict, name: str) -> dict:
    return next(s for s in doc["steps"] if s["name"] == name)


def _final(step: dict) -> dict:
    """The step's last check: after its apply, or the first check when nothing was needed."""
    return step["after"] or step["before"]


def test_board_gets_torch_and_torch_fl_verified_then_zero_actions(
    sshd, iso, provision_cli, wheelhouse
):
    root, env = iso
    sshd.client_home(Path(env["HOME"]))
    rep = root / "board.json"
    args = ["--host", sshd.host, "--only", STEPS, "--artifacts", str(wheelhouse)]
    first = provision_cli(env, *args, "--report", str(rep), timeout=2400)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    doc = _report(rep)
    verify = _step(doc, "build_verify")
    assert _final(verify)["status"] == "ok", verify
    results = _final(verify)["facts"]["result"]
    assert set(results) == {"eager", "sim"}
    assert results["eager"]["max_abs_err"] == 0.0  # the eager executor is the float graph
    assert results["sim"]["cosine"] > 0.98
    # The library came from the board's environment, not from this checkout.
    prefix = sshd.remote / "data" / "torch-fl"
    marker = json.loads((prefix / "torch-fl" / torch_fl_build.MARKER).read_text())
    assert marker["built"] == "built on the board" and marker["wheel"].endswith(".whl")
    assert marker["build_info"]["torch_built_against"] == "2.13.0"
    env_marker = json.loads((prefix / "torch-env" / torch_env.MARKER).read_text())
    assert env_marker["request"]["source"] == "wheelhouse"
    assert any(n.startswith("torch-2.13.0") for n in env_marker["request"]["wheelhouse"])

    second = provision_cli(env, *args, "--report", str(rep), timeout=1200)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert _report(rep)["actions"] == 0

    # A second board of the same kind (here: the same one, its torch-fl gone) installs the
    # wheel the first one built instead of compiling again.
    shutil.rmtree(prefix / "torch-fl")
    third = provision_cli(env, *args, "--report", str(rep), timeout=1200)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    marker = json.loads((prefix / "torch-fl" / torch_fl_build.MARKER).read_text())
    assert marker["built"] == "cached wheel"
    assert _step(_report(rep), "torch_fl")["action"] == "apply"

    # Not a marker alone: the check re-imports, so a half-removed package is found and redone.
    site = next((prefix / "torch-env" / "venv").glob("lib/*/site-packages"))
    shutil.rmtree(site / "onnxruntime")
    dry = provision_cli(env, *args, "--dry", "--report", str(rep), timeout=600)
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    step = _step(_report(root / "board.dry.json"), "torch_env")
    assert step["before"]["status"] == "needed" and "no longer imports" in step["before"]["detail"]
    print({s["name"]: s.get("duration_s") for s in doc["steps"]})  # the first run, per step

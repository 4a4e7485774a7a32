"""One list of system packages (scripts/system-packages.txt) for bootstrap, CI and the matrix.

The installer script runs for real with test doubles of apt-get/dpkg-query/id/sudo first on PATH
(they log their arguments), so root, passwordless sudo and neither are all exercised here.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from scripts.testmatrix.capabilities import enable_hint, system_packages

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "install-system-packages.sh"


def _double(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f'#!/bin/sh\necho "{name} $*" >> "$DOUBLE_LOG"\n{body}\n')
    path.chmod(0o755)


def _run(tmp_path: Path, uid: int, sudo_ok: bool, *args: str) -> tuple[int, str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "log"
    log.write_text("")
    # Only openssh-server counts as installed.
    _double(
        bin_dir,
        "dpkg-query",
        '[ "$3" = openssh-server ] && printf "install ok installed" && exit 0; exit 1',
    )
    _double(bin_dir, "apt-get", "exit 0")
    _double(bin_dir, "id", f"echo {uid}")
    _double(bin_dir, "sudo", "exit 0" if sudo_ok else "exit 1")
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", DOUBLE_LOG=str(log))
    proc = subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60
    )
    return proc.returncode, proc.stdout + proc.stderr, log.read_text()


def _expected_missing() -> list[str]:
    wanted: list[str] = []
    for packages in system_packages().values():
        wanted += [p for p in packages if p not in wanted]
    return [p for p in wanted if p != "openssh-server"]


def test_root_installs_exactly_the_missing_packages(tmp_path: Path) -> None:
    rc, out, log = _run(tmp_path, 0, False)
    assert rc == 0, out
    install = next(line for line in log.splitlines() if line.startswith("apt-get install"))
    assert install.split()[5:] == _expected_missing()
    assert "openssh-server" not in install.split() and "sudo" not in log


def test_passwordless_sudo_is_used_without_prompting(tmp_path: Path) -> None:
    rc, out, log = _run(tmp_path, 1000, True)
    assert rc == 0, out
    assert "sudo -n true" in log and "sudo -n apt-get install -y -qq" in log


@pytest.mark.parametrize(("mode", "code"), [((), 0), (("--require",), 1)])
def test_without_rights_it_prints_the_exact_command(tmp_path: Path, mode, code) -> None:
    rc, out, log = _run(tmp_path, 1000, False, *mode)
    assert rc == code, out
    command = "sudo apt-get install -y --no-install-recommends " + " ".join(_expected_missing())
    assert command in out
    assert "apt-get install" not in log  # nothing was attempted


def test_one_list_for_bootstrap_ci_and_the_matrix_hints() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    assert "apt-get" not in ci, ".ci/run keeps its own package list again"
    assert "SYSTEM=require scripts/bootstrap.sh" in ci
    assert "--require board-emu,board-torch,provision" in ci
    bootstrap = (REPO / "scripts" / "bootstrap.sh").read_text()
    assert "scripts/install-system-packages.sh --require" in bootstrap
    groups = system_packages()
    assert {"sshd", "lab"} <= set(groups)
    hint = enable_hint(["sshd"])
    assert hint.endswith("apt-get install -y --no-install-recommends " + " ".join(groups["sshd"]))
    assert enable_hint(["lab"]).endswith(" ".join(groups["lab"]))
    assert enable_hint(["cuda_device"]) == ""  # hardware: no command makes it appear

"""`invoke provision --host <lab>` against the emulated large-page board.

Runs in file order on one lab: the first test upgrades the preinstalled box64 0.3.4, the second
proves a re-run is idle, the third plants the stand-in old box64 and shows it is caught.
"""

from __future__ import annotations

import re
import shlex
import sys

import pytest
from lab_helpers import EXPECTED_PAGE, REPO, box64_version, guest, put

sys.path.insert(0, str(REPO / "tests" / "standins" / "lab"))
from standin_box64_old import build_old_box64  # noqa: E402
from standin_hbdk4_wheels import make_wheels  # noqa: E402

from provision import probe  # noqa: E402
from provision.target import controller_arch  # noqa: E402

ABORT = "Error: PageSize configuration is wrong: configured with 4096, but got"


def _final(step: dict) -> dict:
    return step["after"] or step["before"]


def _steps(doc: dict) -> dict[str, dict]:
    return {s["name"]: s for s in doc["steps"]}


@pytest.fixture(scope="module")
def oe_wheels(tmp_path_factory):
    path = tmp_path_factory.mktemp("oe-wheels")
    make_wheels(path)
    return path


def _version_of(text: str) -> tuple[int, ...]:
    match = re.search(r"v(\d+)\.(\d+)\.(\d+)", text)
    assert match, text
    return tuple(int(g) for g in match.groups())


def test_provision_upgrades_box64_and_imports_hbdk4(board, provision_on_lab, oe_wheels):
    before = box64_version(board, "/usr/bin/box64")
    # The lab fixture boots a fresh board: trixie's box64 0.3.4, never an earlier run's upgrade.
    assert _version_of(before)[:2] == (0, 3), f"not a fresh board: /usr/bin/box64 is {before}"

    proc, doc = provision_on_lab("--oe-wheels", str(oe_wheels), name="first")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = _steps(doc)
    assert doc["facts"]["arch"] == "aarch64"
    assert int(doc["facts"]["pagesize"]) == EXPECTED_PAGE
    assert steps["box64"]["action"] == "apply"
    assert "0.3.4" in steps["box64"]["before"]["detail"]
    after = _version_of(box64_version(board, "/usr/bin/box64"))
    assert after >= (0, 4, 0), "apt did not install the newer box64 from the offline repo"
    probe_step = _final(steps["pagesize_probe"])
    assert probe_step["status"] == "ok", probe_step
    assert probe_step["facts"]["guest_pagesize"] == EXPECTED_PAGE
    x86 = _final(steps["x86_python"])
    assert x86["status"] == "ok", x86
    assert "standin" in x86["detail"], x86["detail"]  # the stand-in hbdk4 imported under box64


def test_second_run_performs_zero_actions(provision_on_lab, oe_wheels):
    proc, doc = provision_on_lab("--oe-wheels", str(oe_wheels), name="second")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert doc["actions"] == 0, [s["name"] for s in doc["steps"] if s["action"] == "apply"]
    assert all(_final(s)["status"] == "ok" for s in doc["steps"] if s["before"]), doc["steps"]


SHADOW = "/usr/local/bin/box64"  # first in root's PATH, ahead of Debian's /usr/bin/box64


@pytest.fixture
def standin_old_box64(board, tmp_path):
    """The stand-in old box64 planted first in the guest's PATH (removed afterwards)."""
    put(board, build_old_box64(tmp_path / "standin"), SHADOW)
    assert guest(board, "command -v box64").stdout.strip() == SHADOW
    yield SHADOW
    guest(board, f"rm -f {SHADOW} {SHADOW}.torch-fl-old")


def _run_probe(board, tmp_path, box64: str):
    """Provisioning's own x86_64 probe binary, run for real under `box64` on the guest."""
    local = probe.build(tmp_path / "probe", controller_arch())
    remote = f"/tmp/{probe.BINARY_NAME}"
    put(board, local, remote)
    res = guest(board, f"BOX64_NOBANNER=1 BOX64_LOG=0 {shlex.quote(box64)} {remote}")
    verdict = probe.interpret(res.returncode, res.stdout, res.stderr, EXPECTED_PAGE, box64)
    print(f"probe under {box64}: rc {res.returncode}: {(res.stdout + res.stderr).strip()}")
    return res, verdict


def test_probe_catches_standin_old_box64(board, standin_old_box64, provision_on_lab, tmp_path):
    assert _version_of(box64_version(board)) == (0, 2, 6)  # -v succeeds: proves nothing
    res, verdict = _run_probe(board, tmp_path, standin_old_box64)
    assert res.returncode == 255
    assert f"{ABORT} {EXPECTED_PAGE}" in res.stdout + res.stderr
    assert not verdict.ok and "aborts" in verdict.detail
    # Provisioning must never report success while the PATH box64 is the broken one.
    proc, doc = provision_on_lab("--only", "box64,pagesize_probe", name="standin-check")
    box64_step = _steps(doc)["box64"]
    assert box64_step["before"]["status"] == "needed", box64_step
    assert "0.2.6" in box64_step["before"]["detail"], box64_step
    # It moves the hand-installed old binary aside (nothing deleted) and settles on the
    # upgraded /usr/bin/box64, which the probe then proves on the 64 KB-page kernel.
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert box64_step["action"] == "apply" and box64_step["after"]["status"] == "ok", box64_step
    chosen = _final(box64_step)["facts"]["path"]
    assert chosen == "/usr/bin/box64", box64_step
    assert _version_of(box64_version(board, chosen)) >= (0, 4, 0)
    assert guest(board, f"test -x {SHADOW}.torch-fl-old").returncode == 0, "old binary lost"
    assert guest(board, f"test -e {SHADOW}").returncode != 0, "old binary still shadows"
    probe_step = _final(_steps(doc)["pagesize_probe"])
    assert probe_step["status"] == "ok", probe_step
    assert probe_step["facts"]["guest_pagesize"] == EXPECTED_PAGE
    assert _run_probe(board, tmp_path, chosen)[1].ok
    assert _run_probe(board, tmp_path, "box64")[1].ok, "the PATH box64 is still the broken one"


def test_provisioning_replaces_shadowing_old_box64(
    board, standin_old_box64, provision_on_lab, oe_wheels, tmp_path
):
    proc, doc = provision_on_lab("--oe-wheels", str(oe_wheels), name="standin-replace")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = _steps(doc)
    chosen = _final(steps["box64"])["facts"]["path"]
    probe_step = _final(steps["pagesize_probe"])
    assert probe_step["status"] == "ok" and probe_step["facts"]["guest_pagesize"] == EXPECTED_PAGE
    assert _run_probe(board, tmp_path, chosen)[1].ok
    assert _run_probe(board, tmp_path, "box64")[1].ok, "the PATH box64 is still the broken one"

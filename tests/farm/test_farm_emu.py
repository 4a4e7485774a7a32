"""farm-emu: the whole farm path with no hardware. A labgrid coordinator on 127.0.0.1, one
exporter with two places (the emulated 64 KB-page aarch64 board and a loopback-sshd x86_64
"board"), then provisioning and an on-board lane on both at once."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import farm_yaml

from scripts import lab as lab_pkg
from scripts.farm.emu import Board, PrivateLab

EXPECTED_PAGE = {"16k": "16384", "64k": "65536"}[lab_pkg.DEFAULT_PAGE_SIZE]


@pytest.fixture
def private_lab(tmp_path: Path):
    ok, why = lab_pkg.capability()
    if not ok:
        pytest.fail(f"the farm-emu lane needs the board lab: {why}")
    lab = PrivateLab(tmp_path / "lab")
    try:
        yield lab.start()
    finally:
        lab.stop()


def _overlap(a: dict, b: dict) -> bool:
    return a["started"] < b["finished"] and b["started"] < a["finished"]


def test_lab_and_x86_board_provision_and_test_in_parallel(
    private_lab, ssh_boards, farm_factory, farm_cli, tmp_path
):
    lab = private_lab
    server = ssh_boards.add("x86")
    farm = farm_factory(
        [
            Board("rdk-emu", "127.0.0.1", lab.port, "root",
                  {"board": "rdk-emu", "arch": "aarch64", "pagesize": EXPECTED_PAGE}),
            ssh_boards.board(server, "x86-emu", board="x86-emu"),
        ]
    )  # fmt: skip
    known = ssh_boards.known_hosts(extra=lab.known_hosts.read_text())
    cfg = farm_yaml(
        tmp_path / "farm.yaml",
        farm,
        {"rdk-emu": {"identity": str(lab.identity)}, "x86-emu": {"identity": str(server.user_key)}},
        known,
    )
    out = tmp_path / "out"
    res = farm_cli(
        "test", "--farm-config", str(cfg), "--place", "rdk-emu,x86-emu",
        "--lane", "board-smoke", "--matrix-file", "tests/farm_board/matrix.yaml",
        "--setup", "kit", "--out", str(out), timeout=1500,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    doc = json.loads((out / "farm.json").read_text())
    places = {p["place"]: p for p in doc["places"]}
    assert set(places) == {"rdk-emu", "x86-emu"}
    assert _overlap(places["rdk-emu"]["provision"], places["x86-emu"]["provision"]), places
    facts = {name: (p["facts"]["arch"], str(p["facts"]["pagesize"])) for name, p in places.items()}
    assert facts == {"rdk-emu": ("aarch64", EXPECTED_PAGE), "x86-emu": ("x86_64", "4096")}
    caps = {
        n: (p["capabilities"]["arch"], str(p["capabilities"]["page_size"]))
        for n, p in places.items()
    }
    assert caps == facts, "the lanes' own detection must agree with provisioning's facts"
    assert all(r["verdict"] == "ok" and r["buckets"]["passed"] == 3 for r in doc["rows"]), doc[
        "rows"
    ]
    suites = {s.get("name"): s for s in ET.parse(out / "junit.xml").getroot().iter("testsuite")}
    assert {"rdk-emu:board-smoke", "x86-emu:board-smoke"} <= set(suites)
    lab_props = {
        p.get("name"): p.get("value") for p in suites["rdk-emu:board-smoke"].iter("property")
    }
    assert lab_props["fact.arch"] == "aarch64" and lab_props["fact.pagesize"] == EXPECTED_PAGE
    assert farm.client.reservations() == []
    for name in ("rdk-emu", "x86-emu"):
        assert "acquired: None" in farm.client.show(name)


# The board's environment and torch-fl; build_verify (a compile under both executors) is left to
# the board-torch lane, whose own provisioning runs it, and whose tests compile under both too.
FARM_STEPS = "torch_env,torch_fl"


@pytest.fixture
def torch_lab(tmp_path: Path):
    """A private emulated board booted from the lab's `torch` image (sid's torch)."""
    ok, why = lab_pkg.capability(image="torch")
    if not ok:
        pytest.fail(f"the farm-emu lane needs the board lab's torch image: {why}")
    # Booted from the cache (`invoke lab.build`, or the board-torch lane before this one);
    # PrivateLab names the fix when the image is not built yet.
    lab = PrivateLab(tmp_path / "lab", image="torch")
    try:
        yield lab.start()
    finally:
        lab.stop()


# About 11-13 minutes on a 2-core host (provisioning Debian's torch and torch-fl under TCG, bootstrap,
# the 28-test lane): the same place flow the board-torch lane runs on its own emulated board, so
# the farm-emu lane leaves it out (`markers` in matrix.yaml) to keep a cold CI run inside its
# budget; run it with `pytest -m farm_torch_board tests/farm/test_farm_emu.py`.
@pytest.mark.farm_torch_board
def test_farm_test_bootstrap_runs_board_torch_on_the_emulated_board(
    torch_lab, farm_factory, farm_cli, tmp_path
):
    """`invoke farm.test` with its default `--setup bootstrap`, end to end on the emulated 64 KB
    board: provisioning makes the board's environment (Debian's torch, the wheelhouse, torch-fl
    built there), bootstrap completes it, and the board-torch lane runs there."""
    from provision import scratch
    from scripts.lab import cache, rootfs, wheelhouse

    lab = torch_lab
    house, _ = wheelhouse.for_image(cache.metadata(rootfs.cached("torch").parent))
    farm = farm_factory(
        [Board("rdk-torch", "127.0.0.1", lab.port, "root",
               {"board": "rdk-emu", "arch": "aarch64", "pagesize": EXPECTED_PAGE})]
    )  # fmt: skip
    known = tmp_path / "known_hosts"
    known.write_text(lab.known_hosts.read_text())
    cfg = farm_yaml(
        tmp_path / "farm.yaml", farm, {"rdk-torch": {"identity": str(lab.identity)}}, known
    )
    # The controller's cache of wheels the boards built (keyed by the sources, torch, Python and
    # CPU): the board-torch lane's build, where it ran first, is installed instead of rebuilt.
    controller = tmp_path / "controller" / "cache" / "torch-fl" / "provision"
    controller.mkdir(parents=True)
    shared = scratch.controller_cache() / "torch-fl-wheels"
    shared.mkdir(parents=True, exist_ok=True)
    (controller / "torch-fl-wheels").symlink_to(shared)
    out = tmp_path / "out"
    res = farm_cli(
        "test", "--farm-config", str(cfg), "--place", "rdk-torch", "--lane", "board-torch",
        "--only", FARM_STEPS, "--artifacts", str(house), "--out", str(out), "--config",
        str(_no_skips(tmp_path)), timeout=2700,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    doc = json.loads((out / "farm.json").read_text())
    (place,) = doc["places"]
    assert (place["facts"]["arch"], str(place["facts"]["pagesize"])) == ("aarch64", EXPECTED_PAGE)
    (row,) = doc["rows"]
    assert row["verdict"] == "ok", row
    # The board's own detection applied the CUPTI expectation there (no libcupti, no GPU).
    assert row["buckets"]["expected-fail"] == 2, row
    assert row["buckets"]["passed"] >= 20, row
    assert "bootstrap: completing the provisioned environment" in res.stdout
    assert "bootstrap: torch-fl as installed:" in (out / "rdk-torch" / "board.log").read_text()


def _no_skips(tmp_path: Path) -> Path:
    """A provisioning config without the fast config's step skips (--only picks the steps)."""
    path = tmp_path / "provision.yaml"
    path.write_text("steps:\n  skip: []\n")
    return path

"""The farm path with sshd "boards" (x86_64) behind a real labgrid coordinator and exporter."""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from conftest import farm_yaml

from scripts.farm.emu import free_port


def _overlap(a: dict, b: dict) -> bool:
    return a["started"] < b["finished"] and b["started"] < a["finished"]


def _doc(out: Path) -> dict:
    return json.loads((out / "farm.json").read_text())


def test_provision_two_places_in_parallel(ssh_boards, farm_factory, farm_cli, tmp_path):
    servers = [ssh_boards.add(f"s{i}") for i in range(2)]
    farm = farm_factory([ssh_boards.board(s, f"b{i}") for i, s in enumerate(servers)])
    cfg = farm_yaml(
        tmp_path / "farm.yaml",
        farm,
        {f"b{i}": {"identity": str(s.user_key)} for i, s in enumerate(servers)},
        ssh_boards.known_hosts(),
    )
    out = tmp_path / "out"
    res = farm_cli(
        "provision", "--farm-config", str(cfg), "--tag", "arch=x86_64", "--count", "2",
        "--out", str(out),
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    doc = _doc(out)
    places = doc["places"]
    assert sorted(p["place"] for p in places) == ["b0", "b1"]
    assert all(p["errors"] == [] and p["released"] for p in places), places
    assert all(p["provision"]["status"] == "ok" for p in places)
    assert _overlap(places[0]["provision"], places[1]["provision"]), places
    assert {(p["facts"]["arch"], p["facts"]["pagesize"]) for p in places} == {("x86_64", 4096)}
    for server in servers:
        assert (server.remote / "config" / "torch-fl" / "env").is_file()
    assert farm.client.reservations() == []
    for name in ("b0", "b1"):
        assert "acquired: None" in farm.client.show(name)


def test_place_held_by_someone_else_fails(ssh_boards, farm_factory, farm_cli, tmp_path):
    server = ssh_boards.add("s0")
    farm = farm_factory([ssh_boards.board(server, "b0")])
    other = farm.client
    other.env = {"LG_USERNAME": "someone-else", "LG_HOSTNAME": "their-laptop"}
    other.run("-p", "b0", "acquire")
    cfg = farm_yaml(
        tmp_path / "farm.yaml", farm, {"b0": {"identity": str(server.user_key)}},
        ssh_boards.known_hosts(),
    )  # fmt: skip
    out = tmp_path / "out"
    started = time.monotonic()
    res = farm_cli("provision", "--farm-config", str(cfg), "--place", "b0",
                   "--reserve-timeout", "4", "--out", str(out))  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    assert time.monotonic() - started < 120
    (place,) = _doc(out)["places"]
    assert place["place"] is None and "became free" in place["errors"][0]
    assert not (server.remote / "config").exists(), "a held board must not be touched"
    assert farm.client.reservations() == [], "our waiting reservation must be cancelled"
    assert "someone-else" in farm.client.show("b0")


def test_board_that_never_answers_fails(ssh_boards, farm_factory, farm_cli, tmp_path):
    server = ssh_boards.add("s0")
    dead = ssh_boards.board(server, "dead")
    dead.port = free_port()  # nothing listens there
    farm = farm_factory([ssh_boards.board(server, "b0"), dead])
    cfg = farm_yaml(
        tmp_path / "farm.yaml", farm,
        {n: {"identity": str(server.user_key)} for n in ("b0", "dead")}, ssh_boards.known_hosts(),
    )  # fmt: skip
    out = tmp_path / "out"
    res = farm_cli("provision", "--farm-config", str(cfg), "--place", "b0,dead", "--out", str(out))
    assert res.returncode == 1, res.stdout + res.stderr
    rows = {r["place"]: r for r in _doc(out)["rows"]}
    assert rows["b0"]["verdict"] == "ok"
    assert rows["dead"]["verdict"] == "infra-error" and "unreachable" in rows["dead"]["why"]
    assert farm.client.reservations() == []
    junit = ET.parse(out / "junit.xml").getroot()
    assert "dead:provision" in {s.get("name") for s in junit.iter("testsuite")}


def test_tags_contradicting_the_board_fail(ssh_boards, farm_factory, farm_cli, tmp_path):
    server = ssh_boards.add("s0")
    liar = ssh_boards.board(server, "b0", pagesize="65536")  # the board really has 4096
    farm = farm_factory([liar])
    cfg = farm_yaml(
        tmp_path / "farm.yaml", farm, {"b0": {"identity": str(server.user_key)}},
        ssh_boards.known_hosts(),
    )  # fmt: skip
    out = tmp_path / "out"
    res = farm_cli("provision", "--farm-config", str(cfg), "--tag", "pagesize=65536",
                   "--out", str(out))  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    (row,) = _doc(out)["rows"]
    assert row["verdict"] == "infra-error"
    assert "tag pagesize=65536 but the board reports pagesize=4096" in row["why"]
    assert farm.client.reservations() == []


def test_unknown_host_key_is_refused_through_the_farm(ssh_boards, farm_factory, farm_cli, tmp_path):
    server = ssh_boards.add("s0")
    farm = farm_factory([ssh_boards.board(server, "b0")])
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    cfg = farm_yaml(tmp_path / "farm.yaml", farm, {"b0": {"identity": str(server.user_key)}}, empty)
    out = tmp_path / "out"
    res = farm_cli("provision", "--farm-config", str(cfg), "--place", "b0", "--out", str(out))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "known_hosts" in _doc(out)["rows"][0]["why"]
    assert not (server.remote / "config").exists()


def test_exporter_killed_mid_run_fails(ssh_boards, farm_factory, farm_cli, tmp_path):
    server = ssh_boards.add("s0")
    farm = farm_factory([ssh_boards.board(server, "b0")])
    cfg = farm_yaml(
        tmp_path / "farm.yaml", farm, {"b0": {"identity": str(server.user_key)}},
        ssh_boards.known_hosts(),
    )  # fmt: skip
    out = tmp_path / "out"
    # The on-board lane takes seconds; the exporter dies as soon as the place is held.
    import subprocess
    import sys

    argv = [sys.executable, "-m", "invoke", "farm.test", "--farm-config", str(cfg), "--place",
            "b0", "--lane", "board-smoke", "--matrix-file", "tests/farm_board/matrix.yaml",
            "--setup", "kit", "--no-provision", "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=Path(__file__).resolve().parents[2],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "acquired: None" in farm.client.show("b0"):
        time.sleep(0.2)
    farm.exporter.stop()
    output, _ = proc.communicate(timeout=600)
    print(output)
    assert proc.returncode == 1, output
    (place,) = _doc(out)["places"]
    assert place["errors"], place
    assert any("exporter" in e or "NetworkService" in e for e in place["errors"]), place["errors"]
    assert place["released"]
    assert farm.client.reservations() == []


def test_lanes_on_a_board_merge_into_one_report(ssh_boards, farm_factory, farm_cli, tmp_path):
    server = ssh_boards.add("s0")
    farm = farm_factory([ssh_boards.board(server, "b0")])
    cfg = farm_yaml(
        tmp_path / "farm.yaml", farm, {"b0": {"identity": str(server.user_key)}},
        ssh_boards.known_hosts(),
    )  # fmt: skip
    out = tmp_path / "out"
    res = farm_cli("test", "--farm-config", str(cfg), "--place", "b0", "--lane", "board-smoke",
                   "--matrix-file", "tests/farm_board/matrix.yaml", "--setup", "kit",
                   "--out", str(out))  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    doc = _doc(out)
    (row,) = doc["rows"]
    assert row["verdict"] == "ok" and row["buckets"]["passed"] == 3, row
    assert doc["places"][0]["capabilities"]["arch"] == "x86_64"
    suites = {s.get("name"): s for s in ET.parse(out / "junit.xml").getroot().iter("testsuite")}
    props = {p.get("name"): p.get("value") for p in suites["b0:board-smoke"].iter("property")}
    assert props["fact.arch"] == "x86_64" and props["fact.pagesize"] == "4096", props
    assert farm.client.reservations() == []


def test_ctrl_c_gives_back_the_place(ssh_boards, farm_factory, tmp_path):
    import signal
    import subprocess
    import sys

    server = ssh_boards.add("s0")
    farm = farm_factory([ssh_boards.board(server, "b0")])
    cfg = farm_yaml(
        tmp_path / "farm.yaml", farm, {"b0": {"identity": str(server.user_key)}},
        ssh_boards.known_hosts(),
    )  # fmt: skip
    argv = [sys.executable, "-m", "invoke", "farm.test", "--farm-config", str(cfg), "--place",
            "b0", "--lane", "board-smoke", "--matrix-file", "tests/farm_board/matrix.yaml",
            "--setup", "kit", "--no-provision", "--out", str(tmp_path / "out")]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=Path(__file__).resolve().parents[2],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "acquired: None" in farm.client.show("b0"):
        time.sleep(0.2)
    assert "acquired: None" not in farm.client.show("b0"), "the place was never acquired"
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    print(output)
    assert proc.returncode != 0
    assert "gave back b0" in output
    assert "acquired: None" in farm.client.show("b0")
    assert farm.client.reservations() == []

"""Farm inputs and verdicts without a farm: selection, settings, report rules, isolation."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from scripts.farm import selection, settings, tools
from scripts.farm.report import PlaceOutcome, lane_rows, tag_contradictions


def test_places_and_tags_become_reservations():
    reqs = selection.requests(["a,b"], ["board=rdk-s600"], None)
    assert [(r.label, r.filters) for r in reqs] == [
        ("a", {"board": "rdk-s600", "name": "a"}),
        ("b", {"board": "rdk-s600", "name": "b"}),
    ]
    reqs = selection.requests([], ["board=rdk-s600 pagesize=65536"], 3)
    assert len(reqs) == 3 and all(
        r.filters == {"board": "rdk-s600", "pagesize": "65536"} for r in reqs
    )
    assert len({r.label for r in reqs}) == 3


@pytest.mark.parametrize(
    ("places", "tags", "count", "message"),
    [
        ([], [], None, "no places selected"),
        ([], ["board"], None, "is not key=value"),
        ([], ["Board=x"], None, "is not key=value"),
        ([], ["board=a", "board=b"], None, "given twice"),
        (["a,a"], [], None, "twice"),
        (["a"], [], 2, "contradicts"),
        ([], ["board=x"], 0, "--count must be"),
        ([], ["name=x"], None, "use --place"),
    ],
)
def test_bad_selections_name_the_problem(places, tags, count, message):
    with pytest.raises(ValueError, match=message):
        selection.requests(places, tags, count)


def test_coordinator_comes_from_option_env_then_config(tmp_path, monkeypatch):
    monkeypatch.delenv("LG_COORDINATOR", raising=False)
    with pytest.raises(ValueError, match="no coordinator"):
        settings.load(None, None, None)
    assert settings.load(None, None, {"coordinator": "c:1"}).coordinator == "c:1"
    monkeypatch.setenv("LG_COORDINATOR", "e:2")
    assert settings.load(None, None, {"coordinator": "c:1"}).coordinator == "e:2"
    assert settings.load("o:3", None, {"coordinator": "c:1"}).coordinator == "o:3"
    with pytest.raises(ValueError, match="not HOST:PORT"):
        settings.load("nohost", None, None)
    bad = tmp_path / "bad.yaml"
    bad.write_text("coordinator: [1\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        settings.load(None, str(bad), None)
    extra = tmp_path / "extra.yaml"
    extra.write_text("coordinater: a:1\n")
    with pytest.raises(ValueError, match="unknown key"):
        settings.load("a:1", str(extra), None)


@pytest.mark.parametrize(
    ("coordinator", "farm_config", "text", "message"),
    [
        ("a:1", "bin.yaml", None, "bin.yaml is not UTF-8"),
        ("a:1", "", None, "--farm-config '' is empty"),
        ("", None, None, "--coordinator '' is empty"),
        ("a:99999", None, None, "port 99999"),
        ("a:1", "f.yaml", "ssh: {known_hosts: [1]}\n", "ssh.known_hosts"),
        ("a:1", "f.yaml", "places: {p: {ssh: {identity: 5}}}\n", "places.p: ssh.identity"),
    ],
)
def test_bad_farm_settings_name_the_problem(tmp_path, coordinator, farm_config, text, message):
    (tmp_path / "bin.yaml").write_bytes(b"\x00\xfe\xff junk")
    if text is not None:
        (tmp_path / "f.yaml").write_text(text)
    path = str(tmp_path / farm_config) if farm_config else farm_config
    with pytest.raises(ValueError, match=re.escape(message)):
        settings.load(coordinator, path, None)


def test_per_place_ssh_overrides_the_farm_wide_one(tmp_path):
    cfg = tmp_path / "farm.yaml"
    cfg.write_text(
        "ssh: {identity: /k/farm, known_hosts: /k/known}\n"
        "places: {s600: {ssh: {identity: /k/s600}}}\n"
    )
    farm = settings.load("c:1", str(cfg), None)
    assert farm.ssh_for("s600") == {"identity": "/k/s600", "known_hosts": "/k/known"}
    assert farm.ssh_for("other") == {"identity": "/k/farm", "known_hosts": "/k/known"}


def _lane(**buckets):
    base = dict.fromkeys(
        ("passed", "failed", "expected-fail", "unexpected-pass", "skipped", "infra-error"), 0
    )
    return {"name": "smoke", "status": "ran", "buckets": {**base, **buckets}, "problems": []}


@pytest.mark.parametrize(
    ("summary", "verdict"),
    [
        ({"lanes": [_lane(passed=3)]}, "ok"),
        ({"lanes": [_lane(skipped=3)]}, "infra-error"),  # all skipped is never green
        ({"lanes": [_lane(passed=2, failed=1)]}, "failed"),
        ({"lanes": [_lane(passed=2, **{"infra-error": 1})]}, "infra-error"),
        ({"lanes": [{**_lane(), "status": "not-run", "missing": ["lab"]}]}, "infra-error"),
        ({"lanes": []}, "infra-error"),  # the lane never reported
        (None, "infra-error"),  # the board never produced a summary
    ],
)
def test_lane_verdicts(summary, verdict):
    outcome = PlaceOutcome(label="p", place="p", summary=summary)
    (row,) = lane_rows(outcome, ["smoke"])
    assert row["verdict"] == verdict, row


def test_merged_junit_stays_valid_xml_when_a_board_says_control_characters(tmp_path):
    from scripts.farm import report

    outcome = PlaceOutcome(label="p", place="p", summary=None)
    outcome.infra("board said \x1b[31mERROR\x1b[0m \x00 and hung up")
    _, _, junit = report.write([outcome], lane_rows(outcome, ["smoke"]), tmp_path, {})
    error = ET.parse(junit).getroot().find("testsuite/testcase/error")
    assert error is not None and "ERROR" in error.get("message", "")


def test_a_place_error_overrides_a_green_lane():
    outcome = PlaceOutcome(label="p", place="p", summary={"lanes": [_lane(passed=3)]})
    outcome.infra("the exporter of place p went away during the run")
    (row,) = lane_rows(outcome, ["smoke"])
    assert row["verdict"] == "infra-error" and "exporter" in row["why"]


def test_tags_are_checked_against_detected_facts():
    assert tag_contradictions({"arch": "aarch64", "pagesize": "65536"},
                              {"arch": "aarch64", "pagesize": 65536}) == []  # fmt: skip
    assert tag_contradictions({"pagesize": "65536"}, {"page_size": 4096}) == [
        "tag pagesize=65536 but the board reports pagesize=4096"
    ]
    assert tag_contradictions({"board": "x"}, {}) == []  # tags the board cannot report


def test_labgrid_stays_out_of_the_project_environment():
    # Its pytest plugin would load into every lane (about 3 s per pytest start here).
    assert importlib.util.find_spec("labgrid") is None, "labgrid belongs in .venv-farm"
    out = subprocess.run(
        [tools.python(), "-c", "import labgrid, sys; print(sys.prefix)"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).resolve() != Path(sys.prefix).resolve()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["farm.provision", "--tag", "board=x", "--count", "abc", "--coordinator", "h:1"],
         "not a whole number"),
        (["farm.provision", "--place", "a", "--coordinator", "nohost"], "not HOST:PORT"),
        (["farm.test", "--place", "a", "--coordinator", "h:1"], "name the lanes"),
        (["farm.test", "--place", "a", "--coordinator", "h:1", "--lane", "nope"], "unknown lane"),
        (["farm.test", "--place", "a", "--coordinator", "h:1", "--lane", "unit",
          "--setup", "magic"], "--setup 'magic'"),
        # Seconds are finite and positive: NaN never expires, -5 or 0 are typos, not "default".
        (["farm.test", "--place", "a", "--coordinator", "h:1", "--lane", "unit",
          "--lane-timeout", "abc"], "--lane-timeout 'abc'"),
        (["farm.test", "--place", "a", "--coordinator", "h:1", "--lane", "unit",
          "--lane-timeout", "-5"], "--lane-timeout '-5'"),
        (["farm.test", "--place", "a", "--coordinator", "h:1", "--lane", "unit",
          "--lane-timeout", "0"], "--lane-timeout '0'"),
        (["farm.provision", "--place", "a", "--coordinator", "h:1", "--reserve-timeout", "nan"],
         "--reserve-timeout 'nan'"),
        (["farm.provision", "--place", "a", "--coordinator", "h:1", "--boot-timeout", "inf"],
         "--boot-timeout 'inf'"),
        (["farm.provision", "--place", "a", "--coordinator", "h:1", "--count", ""], "--count ''"),
        (["farm.provision", "--place", "a", "--coordinator", "h:1", "--out", "/proc/x"],
         "--out '/proc/x'"),
        (["farm.provision", "--place", "a", "--coordinator", "h:1", "--artifacts", ""],
         "--artifacts '' is empty"),
        (["farm.provision", "--place", "a", "--coordinator", "h:1", "--config", ""],
         "--config '' is empty"),
    ],
)  # fmt: skip
def test_bad_farm_commands_exit_2_before_touching_the_farm(args, message, tmp_path):
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", *args,
         *([] if "--out" in args else ["--out", str(tmp_path / "out")])],
        cwd=repo, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert not (tmp_path / "out").exists()

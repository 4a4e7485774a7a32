"""The lane runner: real pytest/ruff subprocesses on generated trees, buckets, exit codes."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from invoke import Collection, Program

from scripts.tasks import matrix as matrix_tasks
from scripts.testmatrix.request import MatrixRun
from scripts.testmatrix.runner import run_matrix
from scripts.testmatrix.schema import MatrixError
from tests.support.process import wait_for_pid

REPO = Path(__file__).resolve().parents[2]
CAPS: dict[str, Any] = {"arch": "x86_64", "sshd": True, "libcupti": False, "xdist": True}

MIXED = """
import pytest

def test_pass(): pass
def test_fail(): assert False, "boom"
def test_known(): assert False, "known problem"
def test_fixed(): pass
def test_skip(): pytest.skip("not here")
"""


def _tree(
    tmp_path: Path, lanes: str, expectations: str = "", files: dict[str, str] | None = None
) -> Path:
    for rel, text in (files or {}).items():
        target = tmp_path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    text = f"version: 1\nlanes:\n{lanes}"
    if expectations:
        text += f"expectations:\n{expectations}"
    (tmp_path / "matrix.yaml").write_text(text)
    return tmp_path


def _run(root: Path, **kwargs: Any) -> tuple[int, str, dict[str, Any]]:
    out = io.StringIO()
    kwargs.setdefault("caps", CAPS)
    code = run_matrix(MatrixRun(root=root, matrix_file=root / "matrix.yaml", **kwargs), stream=out)
    summary_path = root / "out" / "matrix" / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return code, out.getvalue(), summary


def _lane(summary: dict[str, Any], name: str) -> dict[str, Any]:
    return next(lane for lane in summary["lanes"] if lane["name"] == name)


LANE = "  {name}:\n    paths: [{path}]\n    workers: {workers}\n    timeout: {timeout}\n{extra}"


@pytest.mark.slow
def test_buckets_from_a_real_run(tmp_path: Path) -> None:
    known = (
        '  - test: "tests/mixed/test_m.py::test_known"\n    lanes: [mixed]\n    status: fail\n'
        "    reason: known\n    link: docs/matrix.md\n"
        '  - test: "tests/mixed/test_m.py::test_fixed"\n    lanes: [mixed]\n    status: fail\n'
        "    reason: was broken\n    link: docs/matrix.md\n"
    )
    root = _tree(
        tmp_path,
        LANE.format(name="mixed", path="tests/mixed", workers=2, timeout=120, extra="")
        + LANE.format(name="broken", path="tests/broken", workers=1, timeout=120, extra="")
        + LANE.format(name="clean", path="tests/clean", workers=1, timeout=120, extra="")
        + LANE.format(
            name="sparc",
            path="tests/clean",
            workers=1,
            timeout=120,
            extra="    requires: [arch == sparc, sshd]\n",
        ),  # fmt: skip
        known,
        {
            "tests/mixed/test_m.py": MIXED,
            "tests/broken/test_b.py": "def test_x(:\n",
            "tests/clean/test_c.py": "def test_ok():\n    pass\n",
        },
    )
    code, out, summary = _run(root)
    assert code == 1
    mixed = _lane(summary, "mixed")
    assert mixed["buckets"] == {
        "passed": 1,
        "failed": 1,
        "expected-fail": 1,
        "unexpected-pass": 1,
        "skipped": 1,
        "infra-error": 0,
    }
    assert mixed["workers"] == 2
    broken = _lane(summary, "broken")
    assert broken["buckets"]["infra-error"] == 1
    assert broken["buckets"]["failed"] == 0 and broken["buckets"]["passed"] == 0
    assert "collection error" in broken["problems"][0]["message"]
    assert _lane(summary, "clean")["buckets"]["passed"] == 1
    sparc = _lane(summary, "sparc")
    assert sparc["status"] == "not-run" and sparc["missing"] == ["arch == sparc"]
    # terminal table: one row per lane, not-run lanes name what is missing
    assert "not run (missing: arch == sparc)" in out
    row = next(line for line in out.splitlines() if line.startswith("mixed "))
    assert row.split()[1:7] == ["1", "1", "1", "1", "1", "0"] and row.endswith("FAIL")
    assert "remove this expectation" in out
    # junit per lane, with the node id recorded for the updater
    junit = ET.parse(root / "out" / "matrix" / "junit" / "mixed.xml")
    names = {p.get("value") for p in junit.iter("property") if p.get("name") == "nodeid"}
    assert "tests/mixed/test_m.py::test_known" in names


def test_clean_run_exits_zero_and_writes_json(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        LANE.format(name="clean", path="tests/clean", workers=1, timeout=60, extra=""),
        files={"tests/clean/test_c.py": "def test_ok():\n    pass\n"},
    )
    target = tmp_path / "report" / "summary.json"
    code, out, _ = _run(root, json_path=target, junit_dir=tmp_path / "j")
    assert code == 0, out
    data = json.loads(target.read_text())
    assert data["exit_code"] == 0 and data["lanes"][0]["buckets"]["passed"] == 1
    assert (tmp_path / "j" / "clean.xml").is_file()


def test_timeout_is_infra_error_and_kills_the_lane(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        LANE.format(name="slow", path="tests/slow", workers=1, timeout=3, extra=""),
        files={
            "tests/slow/test_s.py": "import time\n\ndef test_quick():\n    pass\n\n"
            "def test_z_hangs():\n    time.sleep(120)\n"
        },
    )
    start = time.monotonic()
    code, out, summary = _run(root)
    assert time.monotonic() - start < 30
    lane = _lane(summary, "slow")
    assert code == 1
    assert lane["buckets"]["passed"] == 1  # finished tests still count
    # Two infra-errors: the hung test, named, and the lane's own timeout.
    assert lane["buckets"]["infra-error"] == 2 and lane["buckets"]["failed"] == 0
    hung = "tests/slow/test_s.py::test_z_hangs"
    assert [p["nodeid"] for p in lane["problems"]] == [hung, "slow"]
    assert "lane timeout after 3s (1 finished; hung: " + hung in lane["problems"][1]["message"]
    # junit holds this run's story: the pass plus <error> cases, never an older green file.
    junit = ET.parse(root / "out" / "matrix" / "junit" / "slow.xml").getroot()
    errors = [c.get("name") for c in junit.iter("testcase") if c.find("error") is not None]
    assert errors == [hung, "slow"]
    assert junit.find("testsuite").get("errors") == "2"


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"tests/empty/README": "no tests"}, "no tests collected"),
        ({}, "lane path(s) missing: tests/empty"),
    ],
)
def test_lane_that_cannot_test_is_infra_error(
    tmp_path: Path, files: dict[str, str], message: str
) -> None:
    root = _tree(
        tmp_path,
        LANE.format(name="empty", path="tests/empty", workers=1, timeout=60, extra=""),
        files=files,
    )
    code, _, summary = _run(root)
    lane = _lane(summary, "empty")
    assert code == 1 and lane["buckets"]["infra-error"] == 1
    assert message in lane["problems"][0]["message"]


def test_lint_lane_runs_ruff_check_and_format(tmp_path: Path) -> None:
    lint = '  lint:\n    kind: ruff\n    paths: ["pkg"]\n    timeout: 60\n'
    root = _tree(tmp_path, lint, files={"pkg/good.py": 'X = "a"\n'})
    code, _, summary = _run(root)
    assert code == 0 and _lane(summary, "lint")["buckets"]["passed"] == 3  # + import cycles
    (tmp_path / "pkg" / "bad.py").write_text("import os\nX  =  'a'\n")  # unused import + format
    code, _, summary = _run(root)
    lane = _lane(summary, "lint")
    assert code == 1 and lane["buckets"]["failed"] == 2
    junit = ET.parse(root / "out" / "matrix" / "junit" / "lint.xml")
    assert len(list(junit.iter("failure"))) == 2


def test_required_lane_that_cannot_run_fails_the_run(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        LANE.format(
            name="prov", path="tests/p", workers=1, timeout=60, extra="    requires: [sshd]\n"
        ),
        files={"tests/p/test_p.py": "def test_ok():\n    pass\n"},
    )
    code, _, _ = _run(root, caps={**CAPS, "sshd": False})
    assert code == 0  # not run is not a failure by default
    code, out, summary = _run(root, caps={**CAPS, "sshd": False}, require=["prov"])
    assert code == 1 and "required lane cannot run here: missing sshd; enable: " in out


def test_platform_is_a_dry_run(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        LANE.format(name="board", path="tests/b", workers=1, timeout=60,
                    extra="    requires: [page_size == 65536]\n"),
    )  # fmt: skip
    code, out, _ = _run(root, platform="rdk-s600", caps=None)
    assert code == 0 and "platform: rdk-s600" in out and "run tests/b" in out
    code, out, _ = _run(root, platform="x86-ci", caps=None)
    assert "not run (missing: page_size == 65536)" in out
    assert not (root / "out").exists()  # nothing ran
    with pytest.raises(MatrixError, match="unknown platform 'rdk-x9'; use one of"):
        _run(root, platform="rdk-x9", caps=None)


def test_unknown_lane_is_a_one_line_error(tmp_path: Path) -> None:
    root = _tree(tmp_path, LANE.format(name="a", path="t", workers=1, timeout=5, extra=""))
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.testmatrix", "--root", str(root), "--lane", "a,zz"],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--lane: unknown lane(s) 'zz'; known: a" in proc.stderr
    assert "matrix.yaml:0" not in proc.stderr  # a flag's value, not a line of the file


def test_invoke_tasks_are_registered_and_list_works(capsys: pytest.CaptureFixture[str]) -> None:
    ns = Collection()
    matrix_tasks.register(ns)
    assert {"test", "matrix-update"} <= set(ns.task_names)
    program = Program(namespace=ns, name="invoke", binary="invoke")
    program.run(["invoke", "test", "--list", "--platform", "gpu-host"], exit=True)
    out = capsys.readouterr().out
    assert "platform: gpu-host" in out and "profiler" in out
    with pytest.raises(SystemExit) as info:
        program.run(["invoke", "test", "--lane", "nope"], exit=True)
    assert info.value.code == 2


@pytest.mark.slow
def test_stopping_the_runner_stops_the_lane(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        LANE.format(name="slow", path="tests/slow", workers=1, timeout=300, extra=""),
        files={
            "tests/slow/test_s.py": "import os, pathlib, time\n\ndef test_hangs():\n"
            "    pathlib.Path('pid').write_text(str(os.getpid()))\n    time.sleep(300)\n"
        },
    )
    runner = subprocess.Popen(
        [sys.executable, "-m", "scripts.testmatrix", "--root", str(root)], cwd=REPO
    )
    lane_pid = wait_for_pid(root / "pid", 60)
    runner.terminate()
    runner.wait(timeout=30)
    time.sleep(0.5)
    try:
        os.kill(lane_pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive, "the lane outlived the runner"

"""The matrix tells the truth: no stale reports, per-test timeouts, interrupts, summaries, reruns.

Every case runs the real runner on a generated tree (real pytest subprocesses); the CLI cases go
through invoke's real parser.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from invoke import Collection, Program

from scripts.tasks import matrix as matrix_tasks
from scripts.testmatrix import runner as runner_mod
from scripts.testmatrix.request import MatrixRun, UsageError
from scripts.testmatrix.runner import run_matrix
from scripts.testmatrix.schema import MatrixError, load
from tests.support.process import wait_for_pid

REPO = Path(__file__).resolve().parents[2]
CAPS: dict[str, Any] = {"arch": "x86_64", "sshd": True, "xdist": True}
LANE = "  {name}:\n    paths: [{path}]\n    workers: 1\n    timeout: {timeout}\n{extra}"
PASSING = "def test_ok():\n    pass\n"
MIXED = "def test_pass():\n    pass\n\ndef test_fail():\n    assert False, 'boom'\n"


def _tree(tmp_path: Path, lanes: str, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "matrix.yaml").write_text(f"version: 1\nlanes:\n{lanes}")
    return tmp_path


def _run(root: Path, **kwargs: Any) -> tuple[int, str, dict[str, Any]]:
    out = io.StringIO()
    kwargs.setdefault("caps", CAPS)
    code = run_matrix(MatrixRun(root=root, matrix_file=root / "matrix.yaml", **kwargs), stream=out)
    path = root / "out" / "matrix" / "summary.json"
    return code, out.getvalue(), json.loads(path.read_text()) if path.exists() else {}


def _lane(summary: dict[str, Any], name: str) -> dict[str, Any]:
    return next(lane for lane in summary["lanes"] if lane["name"] == name)


GREEN_JUNIT = (
    '<testsuites><testsuite name="{name}" tests="1" failures="0" errors="0">'
    '<testcase classname="x" name="test_old"/></testsuite></testsuites>'
)


def test_earlier_outputs_never_stand_for_this_run(tmp_path: Path) -> None:
    lanes = LANE.format(name="hang", path="tests/hang", timeout=3, extra="") + LANE.format(
        name="other", path="tests/other", timeout=60, extra=""
    )
    root = _tree(
        tmp_path,
        lanes,
        {
            # Hangs at import: pytest is killed before it writes any junit of its own.
            "tests/hang/test_h.py": "import time\ntime.sleep(60)\n",
            "tests/other/test_o.py": PASSING,
        },
    )
    junit_dir = root / "out" / "matrix" / "junit"
    junit_dir.mkdir(parents=True)
    for name in ("hang", "other"):  # a previous, green run of both lanes
        (junit_dir / f"{name}.xml").write_text(GREEN_JUNIT.format(name=name))
    (root / "out" / "matrix" / "summary.json").write_text('{"exit_code": 0}')
    code, out, summary = _run(root, lanes=["hang"])
    assert code == 1
    # a run replaces the results of the lanes it runs and nothing else; the summary says which
    assert (junit_dir / "other.xml").read_text() == GREEN_JUNIT.format(name="other")
    assert summary["covered"] == ["hang"] and [r["name"] for r in summary["lanes"]] == ["hang"]
    suite = ET.parse(junit_dir / "hang.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("errors") == "1"
    assert "test_old" not in (junit_dir / "hang.xml").read_text()
    case = next(suite.iter("testcase"))
    error = case.find("error")
    assert error is not None and "lane timeout after 3s" in error.get("message", "")
    assert summary["exit_code"] == 1 and _lane(summary, "hang")["junit"].endswith("hang.xml")


def test_stale_expectation_is_a_junit_error(tmp_path: Path) -> None:
    root = _tree(tmp_path, LANE.format(name="u", path="tests/u", timeout=60, extra=""), {})
    (root / "tests/u").mkdir(parents=True)
    (root / "tests/u/test_u.py").write_text(PASSING)
    with open(root / "matrix.yaml", "a") as fh:
        fh.write(
            'expectations:\n  - test: "tests/u/test_gone.py"\n    lanes: [u]\n    status: fail\n'
            "    reason: gone\n    link: docs/matrix.md\n"
        )
    code, _, _ = _run(root)
    assert code == 1
    suite = ET.parse(root / "out/matrix/junit/u.xml").getroot().find("testsuite")
    errors = [c for c in suite.iter("testcase") if c.find("error") is not None]
    assert len(errors) == 1 and "stale" not in errors[0].get("name", "")
    assert "matches no test" in errors[0].find("error").get("message", "")


def test_per_test_timeout_names_the_hung_test_and_keeps_the_rest(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        LANE.format(name="t", path="tests/t", timeout=120, extra="    test_timeout: 3\n"),
        {
            "tests/t/test_t.py": "import time\n\ndef test_a_ok():\n    pass\n\n"
            "def test_b_hangs():\n    time.sleep(100)\n\ndef test_c_ok():\n    pass\n"
        },
    )
    start = time.monotonic()
    code, _, summary = _run(root)
    assert time.monotonic() - start < 60
    lane = _lane(summary, "t")
    assert code == 1
    assert lane["buckets"]["passed"] == 2 and lane["buckets"]["failed"] == 1
    assert lane["buckets"]["infra-error"] == 0  # the lane itself finished
    (problem,) = lane["problems"]
    assert problem["nodeid"] == "tests/t/test_t.py::test_b_hangs"
    assert "Timeout" in problem["message"]


def test_test_timeout_must_be_below_the_lane_timeout(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        LANE.format(name="t", path="tests", timeout=10, extra="    test_timeout: 10\n"),
        {},
    )
    with pytest.raises(MatrixError, match="test_timeout 10s must be below the lane timeout"):
        load(root / "matrix.yaml")


def test_matrix_file_that_is_not_utf8_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "matrix.yaml"
    path.write_bytes(b"version: 1\nlanes:\n  unit: \xff\xfe\n")
    with pytest.raises(MatrixError) as info:
        load(path)
    assert "matrix.yaml:3: not UTF-8" in str(info.value)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_stops_the_lane_reports_and_exits_130(tmp_path: Path, sig: int) -> None:
    lanes = (
        LANE.format(name="first", path="tests/first", timeout=60, extra="")
        + LANE.format(name="slow", path="tests/slow", timeout=300, extra="")
        + LANE.format(name="last", path="tests/last", timeout=60, extra="")
    )
    root = _tree(
        tmp_path,
        lanes,
        {
            "tests/first/test_f.py": PASSING,
            "tests/slow/test_s.py": "import os, pathlib, time\n\ndef test_hangs():\n"
            "    pathlib.Path('pid').write_text(str(os.getpid()))\n    time.sleep(300)\n",
            "tests/last/test_l.py": PASSING,
        },
    )
    (root / "out/matrix").mkdir(parents=True)
    (root / "out/matrix/summary.json").write_text('{"exit_code": 0, "lanes": []}')
    proc = subprocess.Popen(
        [sys.executable, "-m", "scripts.testmatrix", "--root", str(root)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lane_pid = wait_for_pid(root / "pid", 90)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    with pytest.raises(ProcessLookupError):
        os.kill(lane_pid, 0)
    assert (
        "interrupted during slow" in out and "Re-run to resume: invoke test --lane slow,last" in out
    )
    assert "INTERRUPTED" in out  # the partial table
    summary = json.loads((root / "out/matrix/summary.json").read_text())
    assert summary["interrupted"] is True and summary["exit_code"] == 130
    assert [lane["name"] for lane in summary["lanes"]] == ["first", "slow"]
    assert _lane(summary, "first")["buckets"]["passed"] == 1
    slow = _lane(summary, "slow")
    assert slow["status"] == "interrupted"
    assert slow["problems"][0]["nodeid"] == "tests/slow/test_s.py::test_hangs"


def test_markdown_summary_and_github_step_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _tree(
        tmp_path,
        LANE.format(name="mixed", path="tests/m", timeout=60, extra=""),
        {"tests/m/test_m.py": MIXED},
    )
    step = tmp_path / "step-summary.md"
    step.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    code, _, _ = _run(root)
    assert code == 1
    text = (root / "out/matrix/summary.md").read_text()
    assert "## Test matrix: FAILED" in text
    assert "| mixed | 1 | 1 | 0 | 0 | 0 | 0 | 1 |" in text
    assert (
        "- **mixed** failed: `tests/m/test_m.py::test_fail`: E       AssertionError: boom" in text
    )
    assert step.read_text() == "earlier step\n" + text


@pytest.mark.slow
def test_rerun_failed_runs_only_what_failed(tmp_path: Path) -> None:
    lanes = LANE.format(name="mixed", path="tests/m", timeout=60, extra="") + LANE.format(
        name="clean", path="tests/c", timeout=60, extra=""
    )
    root = _tree(tmp_path, lanes, {"tests/m/test_m.py": MIXED, "tests/c/test_c.py": PASSING})
    with pytest.raises(UsageError, match="no results of an earlier run"):
        _run(root, rerun_failed=True)
    code, _, _ = _run(root)
    assert code == 1
    code, out, summary = _run(root, rerun_failed=True)
    assert code == 1 and summary["rerun_failed"] is True
    assert [lane["name"] for lane in summary["lanes"]] == ["mixed"]  # clean had nothing to redo
    mixed = _lane(summary, "mixed")
    assert mixed["buckets"]["failed"] == 1 and mixed["buckets"]["passed"] == 0
    assert mixed["selected"] == ["tests/m/test_m.py::test_fail"]
    (root / "tests/m/test_m.py").write_text(MIXED.replace("assert False, 'boom'", "pass"))
    code, out, summary = _run(root, rerun_failed=True)
    assert code == 0 and _lane(summary, "mixed")["buckets"]["passed"] == 1
    code, out, _ = _run(root, rerun_failed=True)
    assert code == 0 and "nothing failed in the last run" in out


@pytest.mark.slow
def test_partial_runs_keep_other_lanes_results_and_reruns(tmp_path: Path) -> None:
    lanes = LANE.format(name="mixed", path="tests/m", timeout=60, extra="") + LANE.format(
        name="clean", path="tests/c", timeout=60, extra=""
    )
    root = _tree(tmp_path, lanes, {"tests/m/test_m.py": MIXED, "tests/c/test_c.py": PASSING})
    junit = root / "out" / "matrix" / "junit"
    assert _run(root)[0] == 1  # both lanes; mixed fails
    mixed_junit = (junit / "mixed.xml").read_text()
    code, _, summary = _run(root, lanes=["clean"])
    assert code == 0 and summary["covered"] == ["clean"]
    assert (junit / "mixed.xml").read_text() == mixed_junit  # untouched by the clean-only run
    assert [r["name"] for r in summary["earlier_lanes"]] == ["mixed"]
    # --rerun-failed still knows mixed failed, two runs ago
    code, _, summary = _run(root, rerun_failed=True)
    assert code == 1 and [r["name"] for r in summary["lanes"]] == ["mixed"]
    assert _lane(summary, "mixed")["selected"] == ["tests/m/test_m.py::test_fail"]
    assert [r["name"] for r in summary["earlier_lanes"]] == ["clean"]


def test_pytest_arguments_pass_through_with_expectations_applied(tmp_path: Path) -> None:
    lanes = LANE.format(name="mixed", path="tests/m", timeout=60, extra="")
    expect = (
        'expectations:\n  - test: "tests/m/test_m.py::test_fail"\n    lanes: [mixed]\n'
        "    status: fail\n    reason: known failure kept for this test\n    link: docs/matrix.md\n"
    )
    root = _tree(tmp_path, lanes + expect, {"tests/m/test_m.py": MIXED})
    code, _, summary = _run(root, pytest_args=["-k", "pass"])
    mixed = _lane(summary, "mixed")
    assert code == 0 and mixed["buckets"]["passed"] == 1 and not mixed["buckets"]["expected-fail"]
    assert mixed["buckets"].get("infra-error", 0) == 0  # no "stale expectation" for a subset
    code, _, summary = _run(root, pytest_args=["-k", "fail"])
    assert code == 0 and _lane(summary, "mixed")["buckets"]["expected-fail"] == 1  # still expected


def test_two_runs_in_one_output_directory_do_not_mix(tmp_path: Path) -> None:
    import fcntl

    root = _tree(
        tmp_path, LANE.format(name="clean", path="tests/c", timeout=60, extra=""),
        {"tests/c/test_c.py": PASSING},
    )  # fmt: skip
    out_dir = root / "out" / "matrix"
    out_dir.mkdir(parents=True)
    with open(out_dir / ".run.lock", "a+") as held:  # another run holds the directory
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(UsageError, match="another matrix run is writing"):
            _run(root)
        assert not (out_dir / "summary.json").exists()
        code, _, _ = _run(root, out_dir=tmp_path / "own")  # its own --out-dir: fine
        assert code == 0
    assert _run(root)[0] == 0


@pytest.mark.slow
def test_lane_heartbeat_shows_elapsed_and_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_FL_HEARTBEAT_S", "0.5")
    root = _tree(
        tmp_path,
        LANE.format(name="slowish", path="tests/s", timeout=60, extra=""),
        {
            "tests/s/test_s.py": "import time\n\ndef test_a():\n    pass\n\n"
            "def test_b():\n    time.sleep(4)\n"
        },
    )
    code, out, _ = _run(root)
    assert code == 0
    beats = [ln for ln in out.splitlines() if ln.startswith("[matrix slowish] ")]
    assert beats, out
    assert any("elapsed, 1/2 done: tests/s/test_s.py::test_b" in ln for ln in beats), beats


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"json_path": "DIR"}, "--json"),
        ({"junit_dir": "FILE/junit"}, "is a file, not a directory"),
        ({"require": ["nope"]}, "--require: unknown lane(s) nope"),
        ({"require": ["other"], "lanes": ["u"]}, "not among the selected lanes"),
        ({"workers": 0}, "--workers 0"),
        ({"json_path": "matrix.yaml"}, "is the matrix file"),
    ],
)
def test_bad_flags_fail_before_any_lane_runs(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    lanes = LANE.format(name="u", path="tests/u", timeout=60, extra="") + LANE.format(
        name="other", path="tests/u", timeout=60, extra=""
    )
    root = _tree(tmp_path, lanes, {"tests/u/test_u.py": PASSING})
    (tmp_path / "DIR").mkdir()
    (tmp_path / "FILE").write_text("")
    for key in ("json_path", "junit_dir"):
        if key in kwargs:
            kwargs[key] = tmp_path / kwargs[key]
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _run(root, **kwargs)
    assert not (root / "out/matrix/logs").exists()


@pytest.fixture
def no_lanes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI cases must fail before any lane of the real matrix.yaml starts."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a lane started")

    monkeypatch.setattr(runner_mod, "run_pytest_lane", refuse)
    monkeypatch.setattr(runner_mod, "run_ruff_lane", refuse)
    monkeypatch.setattr(runner_mod, "detect", lambda: dict(CAPS))


def _program() -> Program:
    ns = Collection()
    matrix_tasks.register(ns)
    return Program(namespace=ns, name="invoke", binary="invoke")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "abc"], "--workers 'abc': use a whole number >= 1"),
        (["--workers", "0"], "--workers '0': use a whole number >= 1"),
        (["--workers", "99999999999"], "--workers '99999999999': use a whole number from 1"),
        (["--matrix", "--require", "nope"], "--require: unknown lane(s) nope"),
        (["--lane", ","], "--lane ',': name at least one lane"),
        (["--matrix", "--json", "/"], "is a directory"),
        # An empty value ("$UNSET") must not drop CI's requirement or run the local default.
        (["--matrix", "--require", ""], "--require '': name at least one lane"),
        (["--matrix", "--require", ","], "--require ',': name at least one lane"),
        (["--platform", ""], "unknown platform ''; use one of"),
    ],
)
def test_invoke_flag_errors_exit_2_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], no_lanes: None
) -> None:
    with pytest.raises(SystemExit) as info:
        _program().run(["invoke", "test", *argv], exit=True)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_workers_reaches_the_runner_as_an_int(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[MatrixRun] = []

    def fake_run_matrix(run: MatrixRun) -> int:
        seen.append(run)
        return 0

    monkeypatch.setattr(runner_mod, "run_matrix", fake_run_matrix)
    _program().run(["invoke", "test", "--lane", "unit", "--workers", "1"], exit=False)
    assert seen[0].workers == 1 and seen[0].lanes == ("unit",)


def test_short_l_is_list(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[MatrixRun] = []
    monkeypatch.setattr(runner_mod, "run_matrix", lambda run: seen.append(run) or 0)
    _program().run(["invoke", "test", "-l"], exit=False)
    assert seen[0].list_only is True


def test_matrix_update_ignores_the_runners_own_error_records(tmp_path: Path) -> None:
    from scripts.testmatrix.update import read_junit

    root = _tree(
        tmp_path,
        LANE.format(name="hang", path="tests/hang", timeout=3, extra=""),
        {"tests/hang/test_h.py": "import time\n\ndef test_sleeps():\n    time.sleep(60)\n"},
    )
    code, _, _ = _run(root)
    assert code == 1
    junit_dir = root / "out/matrix/junit"
    errors = [
        c for c in ET.parse(junit_dir / "hang.xml").iter("testcase") if c.find("error") is not None
    ]
    assert len(errors) == 2  # the hung test and the lane timeout, both runner records
    # A lane timeout is an infra problem to fix, never a failure to declare as expected.
    assert read_junit(junit_dir) == []


@pytest.mark.parametrize(
    "text",
    [
        '{"lanes": [1]}',
        '{"lanes": "abc"}',
        '{"lanes": [{"name": "u", "problems": 5}]}',
        '{"lanes": [{"name": "u", "problems": [{"bucket": "failed"}]}]}',
        '{"lanes": [{"name": ["u"]}]}',
    ],
)
def test_rerun_failed_with_a_corrupt_summary_is_a_usage_error(tmp_path: Path, text: str) -> None:
    root = _tree(
        tmp_path, LANE.format(name="u", path="tests/u", timeout=60, extra=""), {"tests/u/t.py": ""}
    )
    (root / "out/matrix").mkdir(parents=True)
    (root / "out/matrix/summary.json").write_text(text)
    with pytest.raises(UsageError, match="is not a matrix summary"):
        _run(root, rerun_failed=True)


@pytest.mark.slow
def test_json_dash_prints_the_summary_on_stdout_and_a_closed_pipe_is_quiet(
    tmp_path: Path,
) -> None:
    root = _tree(
        tmp_path,
        LANE.format(name="u", path="tests/u", timeout=60, extra=""),
        {"tests/u/test_u.py": MIXED},
    )
    cmd = [sys.executable, "-m", "scripts.testmatrix", "--root", str(root), "--json", "-"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stderr
    assert json.loads(run.stdout)["lanes"][0]["name"] == "u"  # stdout holds only the JSON
    assert "lane" in run.stderr and not (root / "-").exists()
    # `... --json - | head -1`: the reader goes away after one line
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1 and first.strip() == b"{"
    assert "Traceback" not in err and "BrokenPipe" not in err
    assert json.loads((root / "out/matrix/summary.json").read_text())["exit_code"] == 1


@pytest.mark.slow
def test_table_into_a_closed_pipe_still_writes_the_summary(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        LANE.format(name="u", path="tests/u", timeout=60, extra=""),
        {"tests/u/test_u.py": MIXED},
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "scripts.testmatrix", "--root", str(root)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()  # `| head -1`
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1, err
    assert "Traceback" not in err
    assert json.loads((root / "out/matrix/summary.json").read_text())["exit_code"] == 1


@pytest.mark.parametrize("flag", ["--lane", "--require"])
def test_module_cli_refuses_empty_lane_names(tmp_path: Path, flag: str) -> None:
    from scripts.testmatrix.__main__ import main

    root = _tree(tmp_path, LANE.format(name="u", path="tests/u", timeout=60, extra=""), {})
    assert main(["--root", str(root), flag, ""]) == 2
    assert not (root / "out/matrix/logs").exists()


def test_interrupt_while_detecting_leaves_no_earlier_green_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _tree(
        tmp_path,
        LANE.format(name="u", path="tests/u", timeout=60, extra=""),
        {"tests/u/test_u.py": PASSING},
    )
    code, _, summary = _run(root)
    assert code == 0 and summary["exit_code"] == 0

    def ctrl_c() -> dict[str, Any]:
        raise KeyboardInterrupt

    monkeypatch.setattr(runner_mod, "detect", ctrl_c)
    stream = io.StringIO()
    assert run_matrix(MatrixRun(root=root, matrix_file=root / "matrix.yaml"), stream=stream) == 130
    out = root / "out" / "matrix"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["exit_code"] == 130
    assert summary["lanes"] == [] and not (out / "junit" / "u.xml").exists()
    assert "Re-run to resume: invoke test --lane u" in stream.getvalue()


def test_rerun_failed_after_an_interrupt_also_runs_the_lanes_never_reached(
    tmp_path: Path,
) -> None:
    lanes = LANE.format(name="u", path="tests/u", timeout=60, extra="") + LANE.format(
        name="v", path="tests/v", timeout=60, extra=""
    )
    root = _tree(tmp_path, lanes, {"tests/u/test_u.py": PASSING, "tests/v/test_v.py": PASSING})
    (root / "out/matrix").mkdir(parents=True)
    interrupted = {
        "interrupted": True,
        "lanes": [
            {
                "name": "u",
                "status": "interrupted",
                "problems": [{"bucket": "infra-error", "nodeid": "u", "message": "interrupted"}],
            }
        ],
    }
    (root / "out/matrix/summary.json").write_text(json.dumps(interrupted))
    code, _, summary = _run(root, rerun_failed=True)
    assert code == 0 and [lane["name"] for lane in summary["lanes"]] == ["u", "v"]


@pytest.mark.slow
def test_rebuilt_junit_stays_valid_xml_with_control_characters(tmp_path: Path) -> None:
    # A lane killed by its timeout gets its junit rebuilt from the per-test records; a failure
    # message holding control characters (colour codes, NUL) must not make the XML unreadable.
    test = (
        "import time\n\ndef test_bad():\n    assert False, 'ctl \\x01\\x1b[31m red \\x00 nul'\n\n"
        "def test_hang():\n    time.sleep(60)\n"
    )
    root = _tree(
        tmp_path,
        LANE.format(name="c", path="tests/c", timeout=8, extra=""),
        {"tests/c/test_c.py": test},
    )
    code, _, _ = _run(root)
    assert code == 1
    suite = ET.parse(root / "out/matrix/junit/c.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "1" and suite.get("errors") == "2"
    failure = suite.find("testcase/failure")
    assert failure is not None and "red" in failure.get("message", "")

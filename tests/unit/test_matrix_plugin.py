"""The pytest plugin, exercised by real pytest subprocesses on tiny generated test trees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[2]

TESTS = """
import os, signal, subprocess, sys
import pytest

def test_fails():
    assert 1 == 2, "numbers differ"

def test_passes():
    assert True

def test_child_segfaults():
    code = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, f"child died with signal {-p.returncode}: {p.stderr}"

@pytest.fixture
def broken():
    raise RuntimeError("fixture exploded")

def test_setup_error(broken):
    pass

@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    assert n == 1
"""


def _entry(test: str, status: str, extra: str = "") -> str:
    return textwrap.indent(
        f'- test: "{test}"\n  lanes: [unit]\n  status: {status}\n'
        f"  reason: known\n  link: docs/matrix.md\n{extra}",
        "  ",
    )


def _tree(tmp_path: Path, entries: list[str]) -> Path:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_demo.py").write_text(TESTS)
    matrix = "version: 1\nlanes:\n  unit:\n    paths: [tests]\n    timeout: 60\nexpectations:\n"
    (tmp_path / "matrix.yaml").write_text(matrix + "".join(entries))
    (tmp_path / "caps.json").write_text(json.dumps({"sshd": True, "libcupti": False}))
    return tmp_path


def _pytest(root: Path, *args: str) -> tuple[int, str, list[dict[str, str]]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(HARNESS)
    results = root / "results.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "scripts.testmatrix.plugin", "--matrix-lane=unit",
         f"--matrix-caps={root / 'caps.json'}", f"--matrix-results={results}", "-p",
         "no:cacheprovider", "-rA", "--rootdir", str(root), *args, "tests"],
        cwd=root, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    records = [json.loads(x) for x in results.read_text().splitlines()] if results.exists() else []
    return proc.returncode, proc.stdout + proc.stderr, records


def _buckets(records: list[dict[str, str]]) -> dict[str, str]:
    return {r["nodeid"].split("::")[1]: r["bucket"] for r in records if "bucket" in r}


def test_expected_failures_become_xfail(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        [
            _entry("tests/test_demo.py::test_fails", "fail", '  match: "numbers differ"\n'),
            _entry("tests/test_demo.py::test_child_segfaults", "crash"),
            _entry("tests/test_demo.py::test_setup_error", "error"),
            _entry("tests/test_demo.py::test_param[[]2]", "fail"),
        ],
    )
    rc, out, records = _pytest(root)
    buckets = _buckets(records)
    assert buckets == {
        "test_fails": "expected-fail",
        "test_passes": "passed",
        "test_child_segfaults": "expected-fail",
        "test_setup_error": "expected-fail",
        "test_param[1]": "passed",
        "test_param[2]": "expected-fail",
    }, out
    assert rc == 0, out
    assert "XFAIL" in out and "matrix.yaml:7" in out  # reason carries the entry's location


def test_unexpected_pass_fails_with_remove_this_expectation(tmp_path: Path) -> None:
    root = _tree(tmp_path, [_entry("tests/test_demo.py::test_passes", "fail")])
    rc, out, records = _pytest(root)
    assert _buckets(records)["test_passes"] == "unexpected-pass"
    assert rc == 1
    assert "remove this expectation" in out and "[XPASS(strict)]" in out


def test_wrong_kind_of_failure_is_not_hidden(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        [
            _entry("tests/test_demo.py::test_child_segfaults", "fail"),  # it crashes
            _entry("tests/test_demo.py::test_fails", "crash"),  # it only fails
            _entry("tests/test_demo.py::test_setup_error", "fail"),  # it errors in setup
            _entry("tests/test_demo.py::test_param[[]2]", "fail", '  match: "other text"\n'),
        ],
    )
    rc, out, records = _pytest(root)
    buckets = _buckets(records)
    assert buckets["test_child_segfaults"] == "failed"
    assert buckets["test_fails"] == "failed"
    assert buckets["test_setup_error"] == "failed"
    assert buckets["test_param[2]"] == "failed"
    assert "expected to fail but it crashed" in out
    assert "expected to crash but it failed" in out
    assert "expected to fail but it errored" in out
    assert "does not match 'other text'" in out
    assert rc == 1


def test_stale_expectation_is_an_error(tmp_path: Path) -> None:
    root = _tree(tmp_path, [_entry("tests/test_demo.py::test_renamed_long_ago", "fail")])
    rc, out, records = _pytest(
        root, "-k", "not fails and not segfaults and not setup and not param"
    )
    assert rc == 1
    assert "stale expectation" in out and "matrix.yaml:7" in out
    stale = [r for r in records if r.get("event") == "stale"]
    assert len(stale) == 1 and stale[0]["expectation"].endswith("matrix.yaml:7")


@pytest.mark.slow
def test_stale_check_works_under_xdist(tmp_path: Path) -> None:
    root = _tree(tmp_path, [_entry("tests/nothing_*.py", "fail")])
    rc, out, records = _pytest(root, "-n", "2", "-k", "passes")
    assert [r["event"] for r in records if r.get("event") not in (None, "start", "collected")] == [
        "stale"
    ], out
    assert _buckets(records) == {"test_passes": "passed"}
    assert rc == 1


def test_condition_decides_whether_an_entry_applies(tmp_path: Path) -> None:
    when_sshd_missing = "  when:\n    any_missing: [sshd]\n"
    when_cupti_missing = "  when:\n    any_missing: [libcupti]\n"
    root = _tree(
        tmp_path,
        [
            _entry("tests/test_demo.py::test_fails", "fail", when_sshd_missing),  # sshd present
            _entry("tests/test_demo.py::test_param[[]2]", "fail", when_cupti_missing),
        ],
    )
    rc, out, records = _pytest(root)
    buckets = _buckets(records)
    assert buckets["test_fails"] == "failed"  # the entry is inactive: a plain failure
    assert buckets["test_param[2]"] == "expected-fail"
    assert "stale" not in out  # inactive entries are not checked for staleness


@pytest.mark.slow
def test_worker_crash_is_infra_error_unless_crash_expected(tmp_path: Path) -> None:
    root = _tree(tmp_path, [])
    (root / "tests" / "test_kill.py").write_text(
        "import os\n\ndef test_kills_worker():\n    os._exit(3)\n\n"
        "def test_kills_worker_expected():\n    os._exit(3)\n"
    )
    (root / "matrix.yaml").write_text(
        (root / "matrix.yaml").read_text()
        + _entry("tests/test_kill.py::test_kills_worker_expected", "crash")
    )
    rc, out, records = _pytest(root, "-n", "2", "tests/test_kill.py")
    buckets = _buckets(records)
    assert buckets["test_kills_worker"] == "infra-error", out
    assert buckets["test_kills_worker_expected"] == "expected-fail", out

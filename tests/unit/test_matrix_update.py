"""The updater reads junit from a real matrix run and proposes a reviewed diff."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from scripts.testmatrix.request import MatrixRun
from scripts.testmatrix.runner import run_matrix
from scripts.testmatrix.schema import MatrixError, load
from scripts.testmatrix.update import main, read_junit

TESTS = """
def test_ok(): pass
def test_new_break(): assert False, "regressed"
def test_fixed_now(): pass
def test_still_broken(): assert False, "still"
def test_glob_a(): pass
def test_glob_b(): assert False
"""

MATRIX = """\
version: 1
lanes:
  unit:
    paths: [tests]
    timeout: 60
expectations:
  # fixed upstream in the meantime
  - test: "tests/test_u.py::test_fixed_now"
    lanes: [unit]
    status: fail
    reason: upstream bug
    link: https://example.invalid/1
  - test: "tests/test_u.py::test_still_broken"
    lanes: [unit]
    status: fail
    reason: known
    link: https://example.invalid/2
  - test: "tests/test_u.py::test_glob_*"
    lanes: [unit]
    status: fail
    reason: half fixed
    link: https://example.invalid/3
"""


@pytest.fixture
def ran(tmp_path: Path) -> Path:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_u.py").write_text(TESTS)
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    run = MatrixRun(
        root=tmp_path,
        matrix_file=tmp_path / "matrix.yaml",
        caps={"libcupti": False, "sshd": True},
    )
    code = run_matrix(run, stream=io.StringIO())
    assert code == 1  # a new failure and an unexpected pass
    return tmp_path


def test_junit_outcomes(ran: Path) -> None:
    cases = {c.nodeid.split("::")[1]: c for c in read_junit(ran / "out" / "matrix" / "junit")}
    assert (
        cases["test_new_break"].outcome == "failed" and cases["test_new_break"].expectation is None
    )
    assert cases["test_fixed_now"].outcome == "unexpected-pass"
    assert cases["test_fixed_now"].expectation.endswith("matrix.yaml:8")
    assert cases["test_still_broken"].outcome == "expected-fail"
    assert cases["test_ok"].outcome == "passed"


def test_diff_proposes_removal_and_addition(ran: Path) -> None:
    out = io.StringIO()
    assert main(ran / "matrix.yaml", ran / "out" / "matrix" / "junit", stream=out) == 0
    text = out.getvalue()
    removed = [ln for ln in text.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    added = [ln for ln in text.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert '-  - test: "tests/test_u.py::test_fixed_now"' in removed
    assert "-  # fixed upstream in the meantime" in removed
    assert not any("test_still_broken" in ln or "test_glob_" in ln for ln in removed)
    assert '+  - test: "tests/test_u.py::test_new_break"' in added
    assert any("FIXME" in ln for ln in added)
    assert "# this run lacked: libcupti" in text
    assert "note: " in text and "narrow `test: tests/test_u.py::test_glob_*`" in text
    assert (ran / "matrix.yaml").read_text() == MATRIX  # printing only, no write


def test_write_applies_and_placeholders_block_the_next_run(ran: Path) -> None:
    main(ran / "matrix.yaml", ran / "out" / "matrix" / "junit", write=True, stream=io.StringIO())
    new = (ran / "matrix.yaml").read_text()
    assert "test_fixed_now" not in new and "test_new_break" in new
    with pytest.raises(MatrixError, match="placeholder"):
        load(ran / "matrix.yaml")
    fixed = new.replace('"FIXME: why does this fail here, and what would fix it?"', "regression")
    (ran / "matrix.yaml").write_text(fixed.replace('"FIXME: issue or docs link"', "docs/x.md"))
    matrix = load(ran / "matrix.yaml")
    assert [e.test.split("::")[1] for e in matrix.expectations] == [
        "test_still_broken",
        "test_glob_*",
        "test_new_break",
    ]


def test_no_junit_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    out = io.StringIO()
    assert main(tmp_path / "matrix.yaml", tmp_path / "junit", stream=out) == 1
    assert "run `invoke test --matrix` first" in out.getvalue()


@pytest.mark.parametrize("junk", [b"\x00\xfe\xff junk", b"<testsuites><testsuite>"])
def test_corrupt_junit_or_summary_is_a_matrix_error_naming_the_file(
    tmp_path: Path, junk: bytes
) -> None:
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    (tmp_path / "junit").mkdir()
    (tmp_path / "junit" / "unit.xml").write_bytes(junk)
    with pytest.raises(MatrixError, match="unit.xml"):
        main(tmp_path / "matrix.yaml", tmp_path / "junit", stream=io.StringIO())
    (tmp_path / "junit" / "unit.xml").write_text("<testsuites/>")
    (tmp_path / "summary.json").write_bytes(junk)
    with pytest.raises(MatrixError, match="summary.json"):
        main(tmp_path / "matrix.yaml", tmp_path / "junit", stream=io.StringIO())


def test_invoke_matrix_update_refuses_an_empty_junit_dir(capsys: pytest.CaptureFixture) -> None:
    from invoke import Collection, Program

    from scripts.tasks import matrix as matrix_tasks

    ns = Collection()
    matrix_tasks.register(ns)
    with pytest.raises(SystemExit) as info:
        Program(namespace=ns).run(["invoke", "matrix-update", "--junit-dir", ""], exit=True)
    assert info.value.code == 2 and "--junit-dir ''" in capsys.readouterr().err

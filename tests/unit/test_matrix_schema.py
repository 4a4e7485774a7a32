"""matrix.yaml validation: every problem is one `file:line: ...` line, exit 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scripts.testmatrix.schema import MatrixError, Requirement, load, parse

REPO = Path(__file__).resolve().parents[2]

GOOD = """\
version: 1
lanes:
  unit:
    paths: [tests/unit]
    workers: 2
    timeout: 60
  gpu:
    paths: tests/gpu
    requires: [cuda_device, "box64 >= 0.4.0"]
    timeout: 30
  lint:
    kind: ruff
    paths: ["."]
    timeout: 30
expectations:
  - test: "tests/unit/test_a.py::test_x"
    lanes: [unit]
    when:
      any_missing: [libcupti]
    status: fail
    match: "Assertion"
    reason: no CUPTI here
    link: docs/matrix.md
"""


def test_valid_file_parses_with_lines() -> None:
    m = parse(GOOD, "m.yaml")
    assert list(m.lanes) == ["unit", "gpu", "lint"]
    assert m.lanes["unit"].workers == 2 and m.lanes["unit"].line == 3
    assert m.lanes["gpu"].paths == ["tests/gpu"]  # a lone string is a one-item list
    assert [r.text for r in m.lanes["gpu"].requires] == ["cuda_device", "box64 >= 0.4.0"]
    (exp,) = m.expectations
    assert exp.location == "m.yaml:16" and exp.status == "fail"


@pytest.mark.parametrize(
    ("old", "new", "line", "fragment"),
    [
        ("    workers: 2", "    worker: 2", 5, "unknown key 'worker'"),
        ("    workers: 2", "    workers: two", 5, "workers must be an integer >= 1"),
        ("    workers: 2", "    workers: 0", 5, "workers must be an integer >= 1"),
        ("cuda_device,", "cuda_dev,", 9, "unknown capability 'cuda_dev'"),
        ('"box64 >= 0.4.0"', '"box64 >>= 1"', 9, "cannot parse"),
        ("    lanes: [unit]", "    lanes: [unti]", 17, "no lane 'unti'"),
        ("    lanes: [unit]", "    lanes: [lint]", 17, "runs no pytest tests"),
        ("    status: fail", "    status: flaky", 20, "status must be one of"),
        ("    reason: no CUPTI here", "    reason: TODO later", 22, "placeholder"),
        ('    match: "Assertion"', '    match: "(unclosed"', 21, "not a valid regex"),
        ("    timeout: 60", "    timeout: 60\n    timeout: 70", 7, "duplicate key 'timeout'"),
        ("      any_missing:", "      anymissing:", 19, "unknown key 'anymissing'"),
        ("version: 1", "version: 2", 1, "version must be 1"),
        ("    link: docs/matrix.md", "", 16, "missing required key 'link'"),
        ("  gpu:\n", "  gpu:\n   bad: [\n", 10, "YAML syntax error"),
        # A NaN timeout never expires and an infinite one never ends a hung lane.
        ("    timeout: 60", "    timeout: .nan", 6, "timeout (seconds) must be a number >= 1"),
        ("    timeout: 60", "    timeout: .inf", 6, "timeout (seconds) must be a number >= 1"),
        ("    timeout: 60", "    timeout: 60\n    test_timeout: .nan", 7, "test_timeout"),
        ("    workers: 2", "    workers: 100000000000", 5, "workers must be an integer"),
        ("    timeout: 60", '    timeout: 60\n    description: "\x01"', 1, "YAML error"),
        # `env: {A: }` or `{A: yes}` would reach the lane as "None" / "True"
        ("    timeout: 60", "    timeout: 60\n    env: {A: }", 7, "env A must be a string"),
        ("    timeout: 60", "    timeout: 60\n    env: {A: yes}", 7, "env A must be a string"),
        ("    timeout: 60", "    timeout:", 6, "timeout (seconds) must be a number >= 1, got None"),
        ("version: 1", "version:", 1, "version must be 1"),
    ],
)
def test_errors_name_file_and_line(old: str, new: str, line: int, fragment: str) -> None:
    assert old in GOOD
    with pytest.raises(MatrixError) as info:
        parse(GOOD.replace(old, new, 1), "m.yaml")
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(f"m.yaml:{line}: "), text
    assert fragment in text


def test_missing_file_is_a_matrix_error(tmp_path: Path) -> None:
    with pytest.raises(MatrixError, match="cannot read matrix file"):
        load(tmp_path / "nope.yaml")


def test_cli_malformed_file_exits_2_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "matrix.yaml"
    bad.write_text(GOOD.replace("    workers: 2", "    workers: [2]"))
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.testmatrix", "--root", str(tmp_path), "--list"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(
        "matrix.yaml:5: lane 'unit' workers must be a single value, not a list or mapping"
    ), lines


@pytest.mark.parametrize(
    ("text", "caps", "holds"),
    [
        ("sshd", {"sshd": True}, True),
        ("sshd", {"sshd": False}, False),
        ("not sshd", {"sshd": False}, True),
        ("hbdk4", {"hbdk4": "none"}, False),
        ("hbdk4 == native", {"hbdk4": "native"}, True),
        ("hbdk4 != native", {"hbdk4": "emulated"}, True),
        ("box64 >= 0.4.0", {"box64": "0.4.5"}, True),
        ("box64 >= 0.4.0", {"box64": "0.3.10"}, False),
        ("box64 >= 0.4.0", {"box64": None}, False),
        ("page_size == 65536", {"page_size": 65536}, True),
        ("bpu_cores > 1", {"bpu_cores": 4}, True),
        ("bpu_cores > 1", {"bpu_cores": 1}, False),
    ],
)
def test_requirement_semantics(text: str, caps: dict[str, object], holds: bool) -> None:
    m = parse(GOOD.replace('"box64 >= 0.4.0"', f'"{text}"'), "m.yaml")
    req: Requirement = m.lanes["gpu"].requires[1]
    assert req.holds(caps) is holds


def test_repo_matrix_is_valid_and_has_required_lanes() -> None:
    m = load(REPO / "matrix.yaml")
    needed = {
        "unit",
        "eager-parity",
        "compile",
        "exit-cleanliness",
        "profiler",
        "provision",
        "lint",
        "board-emu",
        "board-torch",
    }
    assert needed <= set(m.lanes)
    assert m.lanes["exit-cleanliness"].timeout >= 120
    assert [r.text for r in m.lanes["board-emu"].requires] == ["lab"]
    cupti = [e for e in m.expectations if "test_cupti" in e.test]
    assert cupti and cupti[0].lanes == ["profiler", "board-torch"]

"""A lane `on_board` (matrix.yaml's board-torch): where it runs, what the board gets, how the
farm's bootstrap completes a provisioned board, and the board's wheelhouse pins."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import types
from pathlib import Path

import pytest

from scripts.farm.board import LIBRARY_DIRS, checkout_tarball
from scripts.farm.place_flow import provisioned_env
from scripts.farm.report import PlaceOutcome
from scripts.lab import images, rootfs, wheelhouse
from scripts.testmatrix.schema import MatrixError, load, parse

REPO = Path(__file__).resolve().parents[2]
# A test marked `board`: the decorator, or a marked parameter.
BOARD_MARK = r"^@pytest\.mark\.board$|marks=pytest\.mark\.board\b"

MATRIX = """\
version: 1
lanes:
  on-board:
    paths: [tests/unit]
    markers: board
    on_board: torch
    timeout: 60
"""


def test_an_on_board_lane_is_handed_to_the_emulated_board_except_on_a_board() -> None:
    lane = parse(MATRIX, "m.yaml").lanes["on-board"]
    host = {"arch": "x86_64", "lab": True}
    assert lane.delegated(host) and lane.missing(host) == []
    assert lane.missing({**host, "lab": False}) == ["lab"]  # the lab is what a host needs
    board = {"arch": "aarch64", "lab": False}
    assert not lane.delegated(board) and lane.missing(board) == []


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("on_board: torch", "on_board: jetson", "on_board names a lab image, one of: board, torch"),
        ("    markers: board\n", "    kind: ruff\n", "a ruff lane runs here; remove on_board"),
    ],
)
def test_bad_on_board_values_are_named(old: str, new: str, message: str) -> None:
    with pytest.raises(MatrixError, match=message):
        parse(MATRIX.replace(old, new), "m.yaml")


def test_the_projects_board_torch_lane_selects_marked_tests_of_the_host_lanes() -> None:
    matrix = load(REPO / "matrix.yaml")
    lane = matrix.lanes["board-torch"]
    assert lane.on_board == "torch" and lane.markers == "board"
    host_dirs = {
        p for name, other in matrix.lanes.items() if name != lane.name for p in other.paths
    }
    # the same files as the host lanes, never copies
    assert all(str(Path(p).parent) in host_dirs for p in lane.paths), lane.paths
    marked = subprocess.run(
        ["grep", "-rlE", "--include=test_*.py", BOARD_MARK, "tests"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    # A test marked `board` in a file the lane does not list would never run on the board.
    assert sorted(marked) == sorted(lane.paths)
    cupti = next(e for e in matrix.expectations if "cupti" in e.test)
    assert "board-torch" in cupti.lanes


def test_a_board_with_torch_fl_installed_gets_the_checkout_without_the_library() -> None:
    names = tarfile.open(fileobj=io.BytesIO(checkout_tarball(REPO, LIBRARY_DIRS))).getnames()
    assert "tests/unit/test_board_lane.py" in names and "scripts/bootstrap.sh" in names
    assert not [n for n in names if n.split("/", 1)[0] in LIBRARY_DIRS]
    full = tarfile.open(fileobj=io.BytesIO(checkout_tarball(REPO))).getnames()
    assert "torch_fl/__init__.py" in full


def _report(tmp_path: Path, env_status: str, lib_status: str) -> PlaceOutcome:
    steps = [
        {"name": "torch_env", "before": {"status": "needed", "facts": {}},
         "after": {"status": env_status, "facts": {"root": "/data/torch-fl/torch-env"}}},
        {"name": "torch_fl", "before": {"status": lib_status, "facts": {}}, "after": None},
    ]  # fmt: skip
    path = tmp_path / "provision.json"
    path.write_text(json.dumps({"steps": steps}))
    return PlaceOutcome("p", provision={"report": str(path), "status": "ok"})


def test_the_provisioned_environment_is_found_only_when_both_steps_ended_ok(tmp_path) -> None:
    env = provisioned_env(_report(tmp_path, "ok", "ok"), offline=True)
    assert env is not None
    assert (env.venv, env.wheels) == (
        "/data/torch-fl/torch-env/venv",
        "/data/torch-fl/torch-env/wheels",
    )
    assert provisioned_env(_report(tmp_path, "ok", "ok"), offline=False).wheels == ""
    assert provisioned_env(_report(tmp_path, "ok", "needed"), offline=True) is None
    assert provisioned_env(_report(tmp_path, "error", "ok"), offline=True) is None
    assert provisioned_env(PlaceOutcome("p"), offline=True) is None  # not provisioned


def _bootstrap(tmp_path: Path, **knobs: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SYSTEM": "0", "ZOO": "0", "FARM": "0", **knobs}
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "bootstrap.sh")],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"TORCH": "latest"}, "TORCH=latest is not one of: pin keep"),
        ({"EXTENSION": "maybe"}, "EXTENSION=maybe is not one of: build installed"),
        ({"REQUIREMENTS": "nope.txt"}, "REQUIREMENTS=nope.txt: no such file"),
        (
            {"TORCH": "keep", "VENV": "/nonexistent/venv"},
            "TORCH=keep needs an existing environment",
        ),
    ],
)
def test_bootstrap_refuses_bad_knobs_before_installing_anything(tmp_path, knobs, message) -> None:
    venv = tmp_path / "venv"
    done = _bootstrap(tmp_path, **{"VENV": str(venv), **knobs})
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert not venv.exists() and "creating" not in done.stdout  # refused before anything ran


def test_bootstrap_with_an_installed_extension_names_the_fix_when_there_is_none(tmp_path) -> None:
    """A board venv whose torch imports but which has no torch-fl installed. Its python is a
    stand-in: the real interpreter, except that torch_fl does not import and pip does nothing."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(
        "#!/bin/sh\n# stand-in: a venv with torch and without torch-fl\n"
        'case "$*" in\n'
        "  *torch_fl*) echo \"ModuleNotFoundError: No module named 'torch_fl'\" >&2; exit 1 ;;\n"
        '  "-m pip"*) exit 0 ;;\n'
        "esac\n"
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    done = _bootstrap(
        tmp_path, VENV=str(venv), TORCH="keep", EXTENSION="installed",
        REQUIREMENTS=str(REPO / "requirements-board.txt"),
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "bootstrap: keeping torch" in done.stdout
    assert "EXTENSION=installed but" in done.stderr and "No module named 'torch_fl'" in done.stderr
    assert "fix: provision the board" in done.stderr


def test_the_torch_image_is_arm64_sid_with_debians_torch_and_a_compiler() -> None:
    torch = images.image("torch")
    assert torch.architectures == ("arm64",) and torch.suite == "sid"
    assert {"python3-torch", "g++", "python3-dev", "pybind11-dev"} <= set(torch.packages)
    assert images.CPU_MODEL == "neoverse-n1"  # the boards' A78AE: dot product, no SVE
    # Each image is its own product; the board image's key is the one it had before images.
    assert rootfs.inputs("torch") != rootfs.inputs("board")
    assert "architectures" not in rootfs.inputs("board")
    with pytest.raises(ValueError, match="unknown lab image 'jetson'; use one of: board, torch"):
        images.image("jetson")


def test_the_wheelhouse_reads_the_images_python_and_the_board_pins() -> None:
    assert wheelhouse.python_version("3.14.8-1") == "3.14"
    with pytest.raises(wheelhouse.WheelhouseError, match="cannot read a Python version"):
        wheelhouse.python_version("")
    pins = wheelhouse.requirements()
    assert "pytest==9.2.0" in pins and all("==" in p for p in pins)
    assert wheelhouse.inputs("3.14", pins) == wheelhouse.inputs("3.14", list(reversed(pins)))


def test_a_failed_board_build_names_its_cause(tmp_path: Path) -> None:
    from provision.steps.torch_fl_build import build_error

    log = tmp_path / "torch_fl.log"
    log.write_text(
        "  error: subprocess-exited-with-error\n"
        "  csrc/aten/cpu_alias.h:9:10: fatal error: ATen/core/Tensor.h: No such file or directory\n"
    )
    assert build_error(log).endswith("fatal error: ATen/core/Tensor.h: No such file or directory")
    log.write_text(
        "x\nerror: cannot build torch_fl against torch 2.14.1: torch's C++ headers are missing\n"
        "y: fatal error: z\n"
    )
    assert "libtorch" not in build_error(log) and "cannot build torch_fl" in build_error(log)
    assert "torch's C++ headers" in build_error(tmp_path / "absent.log")


SIGILL_LOG = """\
  Building wheel for torch-fl-bpu (pyproject.toml): finished with status 'error'
  error: subprocess-exited-with-error

  x Building wheel for torch-fl-bpu (pyproject.toml) did not run successfully.
  | exit code: -4
  +-> [0 lines of output]
      [end of output]
  ERROR: Failed building wheel for torch-fl-bpu
"""


class _FakeBoard:
    """Just what TorchFlBuild.build_wheel asks of its context: each build's rc and log."""

    def __init__(self, tmp: Path, logs: list[tuple[int, str]]) -> None:
        self.tmp, self.logs, self.runs, self.said = tmp, list(logs), 0, []
        self.config = types.SimpleNamespace(torch_fl=types.SimpleNamespace(build_timeout_s=60))
        self.target = types.SimpleNamespace(name="board", is_local=False)

    def run_long(self, step: str, cmd: str, timeout: float) -> tuple[int, Path]:
        rc, text = self.logs[self.runs]
        self.runs += 1
        log = self.tmp / f"build{self.runs}.log"
        log.write_text(text)
        return rc, log

    def sh(self, cmd: str) -> tuple[int, str, str]:
        return 0, "/root/dist/torch_fl_bpu-0-cp314-linux_aarch64.whl\n", ""

    def echo(self, line: str) -> None:
        self.said.append(line)


@pytest.mark.parametrize(
    ("logs", "builds", "fails"),
    [
        ([(1, SIGILL_LOG), (0, "ok")], 2, None),  # killed once (qemu TCG): built on the retry
        ([(1, SIGILL_LOG), (1, SIGILL_LOG)], 2, "killed by SIGILL"),  # killed again: it fails
        ([(1, "a.cpp:1:1: fatal error: x.h: No such file\n"), (0, "ok")], 1, "fatal error"),
    ],
    ids=["retried", "killed-twice", "compile-error-not-retried"],
)
def test_a_build_killed_by_a_signal_is_tried_once_more(tmp_path, monkeypatch, logs, builds, fails):
    from provision import artifacts
    from provision.results import StepError
    from provision.steps import torch_fl_build

    monkeypatch.setattr(artifacts, "ship", lambda ctx, path, root, sha=None: f"{root}/src.tar.gz")
    monkeypatch.setattr(torch_fl_build.TorchFlBuild, "build_tools", lambda self, ctx, py: None)
    monkeypatch.setattr(torch_fl_build, "root_dir", lambda ctx: "/root/tfl")
    ctx = _FakeBoard(tmp_path, logs)
    step = torch_fl_build.TorchFlBuild()
    if fails:
        with pytest.raises(StepError, match=fails):
            step.build_wheel(ctx, "/venv/bin/python", tmp_path / "src.tar.gz", "sha")
    else:
        assert step.build_wheel(ctx, "/venv/bin/python", tmp_path / "src.tar.gz", "sha").endswith(
            ".whl"
        )
        assert any("killed by SIGILL (attempt 1 of 2)" in line for line in ctx.said)
    assert ctx.runs == builds
    assert torch_fl_build.killed_by(tmp_path / "build1.log") == (
        4 if "exit code" in logs[0][1] else None
    )


def test_the_harness_runs_from_a_checkout_without_the_library(tmp_path: Path) -> None:
    """What the board gets: the floor's light modules and the extension's capability come from
    the installed torch_fl (here: this environment's), not from the missing torch_fl/."""
    with tarfile.open(fileobj=io.BytesIO(checkout_tarball(REPO, LIBRARY_DIRS))) as tar:
        tar.extractall(tmp_path, filter="data")
    code = (
        "from provision.floor import light; from scripts.testmatrix import capabilities as c; "
        "print(light.PACKAGE_DIR); print(light.load('atomic').__name__); "
        "print(c.torch_fl_ext_built())"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    package, module, ext = done.stdout.split()
    assert not Path(package).is_relative_to(tmp_path) and (Path(package) / "atomic.py").is_file()
    assert module == "_torch_fl_light.atomic" and ext == "True"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["lab.build", "--image", ""], "--image '': use board, torch"),
        (["lab.build", "--image", "torch,jetson"], "--image 'jetson': use board, torch"),
        (["lab.up", "--image", "jetson"], "--image 'jetson': use one of board, torch"),
    ],
)
def test_lab_tasks_refuse_an_unknown_or_empty_image_before_building(argv, message) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "invoke", *argv], cwd=REPO, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr


GUEST_LOG = """\
[   20.975349]     TERM=linux
[   30.141454] udf[97]: unhandled exception: undefined instruction in udf[768,aaaad22f0000+10000]
[   30.142453] CPU: 1 UID: 0 PID: 97 Comm: udf Not tainted 6.12.117 #1
[   31.000000] python3[120]: unhandled exception: EL0 Data Abort, ESR 0x92000006, in libc.so.6
"""


def test_the_guest_kernels_sigill_reports_are_found() -> None:
    from scripts.testmatrix.board_lane import emulator_sigills

    found = emulator_sigills(GUEST_LOG)
    assert found == [
        "[   30.141454] udf[97]: unhandled exception: undefined instruction in "
        "udf[768,aaaad22f0000+10000]"
    ]  # the data abort (SIGSEGV) is no emulator SIGILL
    assert emulator_sigills("") == []


def _fake_runs(monkeypatch, outcomes: list[tuple[str, list[str]]]) -> list[int]:
    """board_lane._run_once replaced: each call takes the next (bucket, sigill lines)."""
    from scripts.testmatrix import board_lane
    from scripts.testmatrix.results import LaneResult

    calls: list[int] = []

    def run_once(lane, root, matrix_file, outputs, log):
        bucket, sigills = outcomes[len(calls)]
        calls.append(1)
        result = LaneResult(lane.name, "ran")
        result.add(bucket, f"tests/x.py::t{len(calls)}", "rc=-4" if bucket != "passed" else "")
        return result, [], sigills

    monkeypatch.setattr(board_lane, "_run_once", run_once)
    return calls


@pytest.mark.parametrize(
    ("outcomes", "runs", "ok"),
    [
        (
            [("failed", ["udf[97]: unhandled exception: undefined instruction"]), ("passed", [])],
            2,
            True,
        ),
        ([("failed", [])], 1, False),  # no SIGILL from the emulator: the failure stands
        ([("passed", ["x[1]: unhandled exception: undefined instruction"])], 1, True),
        (
            [("infra-error", ["a[1]: unhandled exception: undefined instruction"])] * 2,
            2,  # once more only
            False,
        ),
    ],
)
def test_a_lane_the_emulators_sigill_failed_runs_again_once(
    tmp_path: Path, monkeypatch, outcomes, runs, ok
) -> None:
    from scripts.testmatrix.board_lane import run_on_emulated_board
    from scripts.testmatrix.results import OutputDirs

    calls = _fake_runs(monkeypatch, outcomes)
    lane = parse(MATRIX, "m.yaml").lanes["on-board"]
    outputs = OutputDirs(tmp_path / "out", tmp_path / "junit")
    result = run_on_emulated_board(lane, REPO, REPO / "matrix.yaml", outputs, io.StringIO())
    assert (len(calls), result.ok) == (runs, ok)
    text = outputs.log(lane.name).read_text()
    assert ("running the lane again on a fresh board" in text) == (runs == 2)
    assert outputs.junit(lane.name).is_file()


def test_the_lab_kernel_logs_the_processes_it_kills() -> None:
    from scripts.lab import vm

    argv = vm._qemu_argv(Path("/k"), Path("/r"), 2222, 1024)
    assert "sysctl.debug.exception-trace=1" in argv[argv.index("-append") + 1].split()

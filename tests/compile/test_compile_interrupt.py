"""Ctrl-C or kill -9 of a process that is compiling: the hbdk4 worker dies with it and its
temporary directory does not stay behind."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.compile.test_drivers import libhbtl, x86  # noqa: F401  (fixtures)

COMPILER = textwrap.dedent(
    """
    import onnx, sys
    from torch_fl.bpu.drivers import compile_onnx, discover
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])])
    info = discover(refresh=True)
    print("COMPILING", info.kind, flush=True)
    compile_onnx(onnx.helper.make_model(graph).SerializeToString(), info, "nash-e", 2, 600)
    """
)


def _workers(marker: str) -> list[int]:
    """PIDs of live processes whose command line mentions `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            state = (entry / "stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if marker in cmdline and "hbdk4_worker" in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def _wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm", "kill-9"])
def test_worker_and_temp_dir_die_with_the_parent(x86, tmp_path, how):  # noqa: F811
    # the stand-in compiler sleeps forever; emulated: one more process (the "emulator") in the
    # group, and no real torch import in the compiler
    x86(fail="timeout", emulated=True)
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(private_tmp))
    parent = subprocess.Popen(
        [sys.executable, "-c", COMPILER],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert _wait_for(lambda: _workers(str(private_tmp)), 120), "worker never started"
        # the stand-in records its imports, then sleeps in compile(): interrupt it there
        assert _wait_for(x86.record.exists, 120), "stand-in compiler never got to compile()"
        time.sleep(1.0)
        workers = _workers(str(private_tmp))
        sig = {"ctrl-c": signal.SIGINT, "sigterm": signal.SIGTERM, "kill-9": signal.SIGKILL}[how]
        parent.send_signal(sig)
        parent.wait(30)
        assert _wait_for(lambda: not _workers(str(private_tmp)), 15), f"orphaned {workers}"
        left = list(private_tmp.glob("torch-fl-hbdk4-*"))
        assert _wait_for(lambda: not list(private_tmp.glob("torch-fl-hbdk4-*")), 15), left
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in _workers(str(private_tmp)):
            os.kill(pid, signal.SIGKILL)  # leave no sleeper behind when the test fails


def test_work_dirs_of_dead_owners_are_swept(x86, tmp_path, monkeypatch):  # noqa: F811
    from torch_fl.bpu.drivers import compile_onnx, driver

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(driver.tempfile, "tempdir", None)  # re-read TMPDIR
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / "torch-fl-hbdk4-stale"
    stale.mkdir()
    (stale / "owner.pid").write_text(str(dead.pid))
    alive = tmp_path / "torch-fl-hbdk4-alive"
    alive.mkdir()
    (alive / "owner.pid").write_text(str(os.getpid()))
    info = x86(emulated=False)
    import onnx

    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
    )
    hbm, _ = compile_onnx(onnx.helper.make_model(graph).SerializeToString(), info, "nash-e", 2, 60)
    assert hbm.startswith(b"HBM-STANDIN")
    assert not stale.exists() and alive.exists()
    assert sorted(p.name for p in tmp_path.glob("torch-fl-hbdk4-*")) == ["torch-fl-hbdk4-alive"]

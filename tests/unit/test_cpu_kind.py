"""scripts/cpu_kind.py: benchmarks as an AVX2-only CPU on an AVX-512 host (CPUID masked by a
preloaded stand-in), checked in a real subprocess: what PyTorch, the extension and ONNX Runtime's
kernels (through the sim's probe) pick there."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from scripts import cpu_kind

ROOT = cpu_kind.HERE.parent

REPORT = """
import json, torch
from torch_fl import _C
from torch_fl.bpu.runtime import sim_kernels
print(json.dumps({
    "torch": torch.backends.cpu.get_cpu_capability(),
    "depthwise": _C._depthwise_kernel(),
    "gemv": _C._gemv_kernel(),
    "u8s8": sim_kernels.probe("u8s8"),
    "mixed": sim_kernels.probe("mixed"),
    "auto": sim_kernels.choose("auto").path,
}))
"""


def _report(env: dict[str, str] | None) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", REPORT], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_unknown_kind_names_the_known_ones():
    reason = cpu_kind.unsupported("avx9")
    assert reason is not None and "avx9" in reason and "avx2" in reason and "native" in reason
    with pytest.raises(RuntimeError, match="unknown CPU kind"):
        cpu_kind.library("avx9")


@pytest.mark.skipif(
    cpu_kind.unsupported("avx2") is not None, reason=str(cpu_kind.unsupported("avx2"))
)
def test_avx2_emulation_makes_every_library_pick_avx2(tmp_path):
    lib = cpu_kind.library("avx2", cache=tmp_path)
    assert lib.exists() and cpu_kind.library("avx2", cache=tmp_path) == lib  # built once
    assert [p.name for p in lib.parent.iterdir()] == [lib.name]  # no half-written leftovers
    emulated = _report(cpu_kind.environment("avx2"))
    assert emulated["torch"] == "AVX2"
    assert emulated["depthwise"] == "avx2" and emulated["gemv"] == "portable"
    # ONNX Runtime's AVX2 u8s8 kernels add pairs in saturating int16, as on a real AVX2 host:
    # the probe sees it, and the sim takes `mixed` (u8s8 only on Relu'd inputs)
    assert emulated["u8s8"] is not None and "saturat" in emulated["u8s8"]
    assert emulated["mixed"] is None and emulated["auto"] == "mixed"
    if "avx512f" in cpu_kind.cpu_flags():  # the same libraries, unmasked, pick AVX-512 here
        native = _report(None)
        assert native["torch"] != "AVX2" and native["depthwise"] == "avx512"


def test_check_refuses_a_process_that_is_not_emulated(monkeypatch):
    monkeypatch.delenv(cpu_kind.MARK, raising=False)
    with pytest.raises(RuntimeError, match="did not take"):
        cpu_kind.check("avx2")


def test_bench_refuses_a_kind_this_host_cannot_emulate(monkeypatch, capsys):
    from scripts import bench_sim

    monkeypatch.setattr(cpu_kind, "unsupported", lambda kind: "no CPUID faulting here")
    monkeypatch.delenv(cpu_kind.MARK, raising=False)
    with pytest.raises(SystemExit) as exit_info:
        bench_sim.main(["--cpu-kind", "avx2", "--models", "resnet18"])
    assert exit_info.value.code == 2
    assert "--cpu-kind avx2: no CPUID faulting here" in capsys.readouterr().err


def test_bench_refuses_a_stand_in_that_does_not_build(monkeypatch, capsys):
    from scripts import bench_sim

    def broken(kind, base=None):
        raise RuntimeError("building the avx2 stand-in failed: cc: error")

    monkeypatch.setattr(cpu_kind, "unsupported", lambda kind: None)
    monkeypatch.setattr(cpu_kind, "environment", broken)
    monkeypatch.delenv(cpu_kind.MARK, raising=False)
    with pytest.raises(SystemExit) as exit_info:
        bench_sim.main(["--cpu-kind", "avx2", "--models", "resnet18"])
    assert exit_info.value.code == 2
    assert "stand-in failed" in capsys.readouterr().err


def test_bench_in_a_process_the_emulation_missed_says_so(monkeypatch):
    from scripts import bench_sim

    monkeypatch.setenv(cpu_kind.MARK, "avx2")  # marked, but this process's CPUID is the host's
    # ... and the host's has AVX-512 (on an AVX2-only host the libraries' picks would pass the
    # check, rightly, and the whole benchmark would run)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    with pytest.raises(SystemExit, match="--cpu-kind avx2: the avx2 emulation did not take"):
        bench_sim.main(["--cpu-kind", "avx2", "--models", "resnet18"])


def test_ctrl_c_while_the_emulated_run_goes_exits_130_with_one_line(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cpu_kind, "unsupported", lambda kind: None)
    monkeypatch.setattr(cpu_kind, "environment", lambda kind, base=None: {})
    monkeypatch.setattr(cpu_kind.subprocess, "call", interrupted)
    monkeypatch.delenv(cpu_kind.MARK, raising=False)
    assert cpu_kind.rerun_as("avx2", "bench.py", [], "bench_x") == 130
    assert capsys.readouterr().err.strip() == "bench_x: interrupted"

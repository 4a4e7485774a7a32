"""CUDA/CUPTI parity: the same workload traced on a GPU host must have the structure of the
flagos trace (same op sequence), plus GPU kernel events from CUPTI.

These need libcupti and a CUDA device. Where either is missing they fail (they are not skipped):
matrix.yaml declares them expected failures there, so a GPU host that passes them is reported
and a host that unexpectedly passes them is caught.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity

import torch_fl  # noqa: F401
from tests.profiler.trace_tools import aten_sequence, capture, complete_events, matmul_workload

OPS = {"aten::mm", "aten::relu", "aten::matmul"}


def require_cupti_and_gpu() -> None:
    name = ctypes.util.find_library("cupti") or "libcupti.so"
    try:
        ctypes.CDLL(name)
    except OSError as exc:
        raise AssertionError(f"no libcupti: {exc}") from exc
    assert torch.cuda.is_available(), "no CUDA device: no GPU kernel events"


@pytest.mark.board
def test_cuda_kernel_events_captured(tmp_path: Path):
    require_cupti_and_gpu()
    events = capture(
        matmul_workload("cuda"), tmp_path, [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    )
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert len(kernels) >= 10, f"expected >= 10 GPU kernels for 10 matmuls, got {len(kernels)}"
    assert all(e["dur"] > 0 for e in kernels)


@pytest.mark.board
def test_cuda_trace_structure_matches_flagos(tmp_path: Path):
    require_cupti_and_gpu()
    flagos = aten_sequence(
        capture(matmul_workload("flagos"), tmp_path, [ProfilerActivity.CPU]), OPS
    )
    cuda = aten_sequence(
        capture(matmul_workload("cuda"), tmp_path, [ProfilerActivity.CPU, ProfilerActivity.CUDA]),
        OPS,
    )
    assert flagos == cuda, (flagos, cuda)
    assert complete_events(
        capture(matmul_workload("flagos"), tmp_path, [ProfilerActivity.CPU]), "flagos::"
    )

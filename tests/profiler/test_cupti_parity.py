"""CUDA/CUPTI parity: the same workload traced on a GPU host must have the structure of the
flagos trace (same op sequence), plus GPU kernel events from CUPTI.

These need libcupti and a CUDA device. Where either is missing they fail (they are not skipped):
matrix.yaml declares them expected failures there, so a GPU host that passes them is reported
and a host that unexpectedly passes them is caught.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity

import torch_fl  # noqa: F401
from scripts.testmatrix.capabilities import libcupti_loadable
from tests.profiler.trace_tools import aten_sequence, capture, complete_events, matmul_workload

OPS = {"aten::mm", "aten::relu", "aten::matmul"}


def require_cupti_and_gpu() -> None:
    # The matrix's own probe, so a host it calls `libcupti` is a host these tests call so: pip's
    # CUDA wheels keep libcupti in site-packages, where a bare dlopen("libcupti.so") misses it.
    assert libcupti_loadable(), "no libcupti (system, CUDA_HOME or pip nvidia/* dirs)"
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

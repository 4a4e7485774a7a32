"""torch.profiler on the flagos device and on compiled BPU partitions."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity

import torch_fl  # noqa: F401 - registers flagos
from tests.profiler.trace_tools import aten_sequence, capture, complete_events, matmul_workload

CPU = [ProfilerActivity.CPU]


@pytest.mark.board
def test_fallback_ranges_have_durations(tmp_path: Path):
    events = capture(matmul_workload("flagos"), tmp_path, CPU)
    ranges = complete_events(events, "flagos::cpu_fallback")
    assert len(ranges) >= 20, "10 matmuls + 10 relus each run through the fallback"
    assert all(e["dur"] > 0 for e in ranges)
    mm = complete_events(events, "aten::mm")
    assert mm and all(e["dur"] > 0 for e in mm)


@pytest.mark.board
def test_flagos_trace_structure_matches_cpu(tmp_path: Path):
    # What the CUPTI parity test compares against CUDA, checked on every host against the CPU:
    # the fallback's nested re-dispatch must not read as a second op.
    ops = {"aten::mm", "aten::relu", "aten::matmul"}
    flagos = aten_sequence(capture(matmul_workload("flagos"), tmp_path, CPU), ops)
    cpu = aten_sequence(capture(matmul_workload("cpu"), tmp_path, CPU), ops)
    assert flagos == cpu == ["aten::matmul", "aten::mm", "aten::relu"] * 10, (flagos, cpu)


def test_stream_ids_in_trace_are_real(tmp_path: Path):
    a = torch.randn(32, 32, device="flagos")
    s1, s2 = torch.flagos.Stream(), torch.flagos.Stream()
    assert s1.stream_id != s2.stream_id

    def work() -> None:
        with torch.flagos.stream(s1):
            torch.relu(a)
        with torch.flagos.stream(s2):
            torch.sigmoid(a)
        torch.tanh(a)

    events = capture(work, tmp_path, CPU)
    ranges = sorted(complete_events(events, "flagos::cpu_fallback"), key=lambda e: e["ts"])
    streams = [e["args"]["Concrete Inputs"][0] for e in ranges]
    assert streams == [str(s1.stream_id), str(s2.stream_id), "0"], streams


@pytest.mark.board
def test_compiled_partitions_show_as_named_ranges(tmp_path: Path):
    torch._dynamo.reset()
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 1)
    ).eval()
    x = torch.randn(1, 3, 16, 16)
    compiled = torch.compile(model, backend="bpu", options={"executor": "eager"})
    with torch.no_grad():
        compiled(x)  # compile outside the trace
        events = capture(lambda: compiled(x), tmp_path, CPU)
    ranges = complete_events(events, "bpu::partition")
    assert ranges, "every partition call must appear as a named range"
    assert all(e["dur"] > 0 for e in ranges)
    assert all(e["name"].endswith("[eager]") for e in ranges), [e["name"] for e in ranges]
    torch._dynamo.reset()


def test_events_time_a_workload():
    start, end = torch.flagos.Event(), torch.flagos.Event()
    work = matmul_workload("flagos")
    start.record()
    work()
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) > 0

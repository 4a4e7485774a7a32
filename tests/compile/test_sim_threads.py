"""The sim executor's ORT thread count: measured on the first call (runtime/sim_threads.py)."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from tests.compile.bpu_helpers import compile_bpu, runtimes
from torch_fl.bpu import report
from torch_fl.bpu.runtime import sim_threads


def test_candidates_are_one_half_and_all():
    assert sim_threads.candidates(0, 8) == (1, 4, 8)
    assert sim_threads.candidates(2, 8) == (1, 2)
    assert sim_threads.candidates(0, 1) == (1,)
    assert sim_threads.candidates(3, 16) == (1, 3)


def test_choice_adds_the_check_where_no_cpu_is_left_for_it():
    # 2 threads run the session faster, but leave no CPU for the checker thread: the check's
    # 5 ms then lands inside the call, and 1 thread wins
    choice = sim_threads.choose({1: 0.010, 2: 0.008}, 0.005, lambda n: n < 2)
    assert choice.threads == 1 and choice.times_ms == {1: 10.0, 2: 13.0}
    assert "weight check included at [2]" in choice.reason
    # a check that overlaps at every count changes nothing
    assert sim_threads.choose({1: 0.010, 2: 0.008}, 0.005, lambda n: True).threads == 2
    # equal times: the fewer threads
    assert sim_threads.choose({1: 0.008, 2: 0.008}, 0.0, lambda n: True).threads == 1


def test_measure_interleaves_and_bounds_its_rounds():
    calls: list[int] = []
    times = sim_threads.measure(
        {1: lambda: calls.append(1), 2: lambda: calls.append(2)}, rounds=3, budget_s=10, pause_s=0.0
    )
    # one warm-up each, then 3 rounds: each turn an untimed run, then the timed one
    assert calls == [1, 2] + [1, 1, 2, 2] * 3 and set(times) == {1, 2}
    calls.clear()
    sim_threads.measure(
        {1: lambda: calls.append(1), 2: lambda: calls.append(2)},
        rounds=2, budget_s=10, pause_s=0.0, turn_warmups=0,
    )  # fmt: skip
    assert calls == [1, 2] * 3
    calls.clear()
    sim_threads.measure({1: lambda: calls.append(1)}, rounds=50, budget_s=0.0, pause_s=0.0)
    assert calls == [1, 1]  # the budget spent after the first round: no more rounds


def test_measure_calls_its_idle_before_each_timed_run_instead_of_pausing():
    calls: list[str] = []
    start = time.perf_counter()
    sim_threads.measure(
        {1: lambda: calls.append("1"), 2: lambda: calls.append("2")},
        rounds=2, budget_s=10, pause_s=5.0, idle=lambda: calls.append("idle"),
    )  # fmt: skip
    assert time.perf_counter() - start < 5.0  # the pause was not slept
    assert calls == ["1", "2"] + ["1", "idle", "1", "2", "idle", "2"] * 2


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def _first_call(**options):
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(2, 3, 8, 8)
    compiled = compile_bpu(model, executor="sim", cache=False, calibrate="first-call", **options)
    with report.collect() as reps, torch.no_grad():
        out = compiled(x)
    return reps, out, compiled, x


def test_measured_choice_is_used_and_explained():
    cpus = sim_threads.usable_cpus()
    reps, out, compiled, x = _first_call(sim_threads=0)
    rt = runtimes(reps)[0]
    entry = rt.entry.sim_threads
    expected = sim_threads.candidates(0, cpus)
    assert entry["threads"] in expected
    if len(expected) > 1:
        assert sorted(entry["times_ms"]) == list(expected)
        assert entry["times_ms"][entry["threads"]] == min(entry["times_ms"].values())
    # the session that runs is the one chosen
    options = rt._exec.session.get_session_options()
    assert options.intra_op_num_threads == entry["threads"]
    text = report.Report(reps).table()
    assert f"sim threads: graph {reps[0].graph_id} part 0: {entry['threads']} (" in text
    with torch.no_grad():
        again = compiled(x)
    assert torch.equal(again, out) and rt.builds == 1


@pytest.mark.parametrize("threads", [1, 2])
def test_fixed_runs_exactly_the_count_asked(threads):
    reps, out, _, _ = _first_call(sim_threads=threads, sim_thread_choice="fixed")
    rt = runtimes(reps)[0]
    assert rt.entry.sim_threads == {
        "threads": threads,
        "reason": "sim_thread_choice='fixed'",
        "times_ms": None,
    }
    assert rt._exec.session.get_session_options().intra_op_num_threads == threads
    # the same int8 numbers at either count (integer kernels; one float Gemm accumulates in
    # another order at most)
    reps1, out1, _, _ = _first_call(sim_threads=1, sim_thread_choice="fixed")
    assert torch.allclose(out, out1, atol=1e-5)


def test_bad_choice_is_refused_with_the_choices():
    with pytest.raises(Exception, match="measured"):
        _first_call(sim_thread_choice="fastest")

"""scripts/bench_sim.py's two timings: steady blocks of back-to-back calls, and the verdicts of
both printed per row. Fake variants (no model): what is asserted is the order of the calls and
the budget of a block, which decide what the table's milliseconds mean."""

from __future__ import annotations

import time

from scripts import bench_sim


def _recording(log: list[str], name: str, sleep_s: float = 0.0):
    def run() -> None:
        log.append(name)
        if sleep_s:
            time.sleep(sleep_s)

    return run


def test_steady_gives_each_variant_a_block_of_back_to_back_calls_per_round() -> None:
    log: list[str] = []
    fns = {"a": _recording(log, "a"), "b": _recording(log, "b")}
    medians = bench_sim._steady(fns, rounds=2)
    block = bench_sim.WARM_CALLS + bench_sim.BLOCK_CALLS  # the untimed calls, then the timed
    assert log == (["a"] * block + ["b"] * block) * 2
    assert set(medians) == {"a", "b"} and all(v >= 0.0 for v in medians.values())


def test_a_slow_variant_stops_its_block_at_the_budget_but_never_under_one_warm_and_two_timed() -> (
    None
):
    log: list[str] = []
    slow_s = bench_sim.BLOCK_BUDGET_S  # one call alone spends the block's budget
    fns = {"slow": _recording(log, "slow", slow_s), "fast": _recording(log, "fast")}
    medians = bench_sim._steady(fns, rounds=1)
    assert log.count("slow") == 1 + 2
    assert log.count("fast") == bench_sim.WARM_CALLS + bench_sim.BLOCK_CALLS
    assert medians["slow"] >= slow_s * 1e3 * 0.9 > medians["fast"]


def test_steady_idles_before_each_block_when_asked() -> None:
    fns = {"a": lambda: None, "b": lambda: None}
    start = time.perf_counter()
    bench_sim._steady(fns, rounds=2, settle=0.05)
    assert time.perf_counter() - start >= 4 * 0.05


def _row(steady: dict[str, float], gapped: dict[str, float]) -> dict:
    row = {
        "model": "m",
        "batch": 1,
        "threads": 2,
        "latency_ms": steady,
        "ratios": bench_sim._ratios(steady),
        "ratios_gapped": bench_sim._ratios(gapped),
    }
    row["targets"] = bench_sim._met(row["ratios"])
    row["targets_gapped"] = bench_sim._met(row["ratios_gapped"])
    return row


def test_a_row_prints_the_verdict_of_each_timing() -> None:
    steady = {"ort_fp32": 8.0, "ort_int8": 11.0, "sim": 5.0, "eager": 17.0}
    gapped = {"ort_fp32": 8.0, "ort_int8": 12.0, "sim": 10.0, "eager": 17.0}
    row = _row(steady, gapped)
    assert row["ratios"] == {"sim_vs_ort_int8": 2.2, "sim_vs_ort_fp32": 1.6}
    line = bench_sim._row_line(row)
    assert line.endswith("met; missed sim_vs_ort_fp32"), line
    assert " 1.20  0.80 " in line  # the gapped ratios beside the steady ones


def test_breakdown_times_each_layer_of_a_real_sim_call(tmp_path) -> None:
    """The breakdown finds the partition's arguments where the compiled graph calls it (its
    runtime's __call__) and times each layer; a capture that missed the call raised KeyError."""
    import torch

    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4)
    ).eval()
    x = torch.randn(1, 3, 8, 8)
    compiled, runtimes = bench_sim._sim(model, x, [torch.randn(1, 3, 8, 8)], 1)
    out = bench_sim.breakdown(compiled, runtimes[0], x, 2, tmp_path)
    for key in ("ort_session", "executor", "partition", "compiled_call", "harness_ms"):
        assert key in out
    assert out["compiled_call"] >= out["ort_session"] > 0

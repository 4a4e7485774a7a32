"""The public-architecture zoo through backend="bpu": coverage, accuracy and speed per model.

Per model (tests/support/zoo.py): compute-node coverage, partitions, what stayed on the CPU,
eager-executor exactness, cosine vs fp32 of the sim executor at the default activation scale and
after `bpu.calibrate`, the calibrated partitions' quantization health, and latency at 1 thread of
eager fp32, torch.compile(backend="inductor") and the sim executor (sim_threads=1), measured
interleaved (round-robin) in one run so machine drift hits every variant alike. Each target is
printed met / missed. Writes JSON and a PNG plot next to it.

  python scripts/bench_zoo.py [--scale bench|test] [--models resnet18,vit] [--iters 20]
                              [--json out/bench_zoo.json] [--no-timing] [--no-inductor]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts import plots  # noqa: E402

COVERAGE_TARGET = 98.0
PARTITION_TARGET = 2
COSINE_TARGET = 0.999
# sim at 1 thread vs eager fp32 at 1 thread: (with VNNI, without VNNI); also faster than inductor
SPEED_TARGETS = {"resnet18": (4.0, 2.0), "mobilenetv3_small": (2.5, 2.0)}


def cpu_has_vnni() -> bool:
    """Whether u8 x s8 products accumulate straight into int32 here (VNNI, AMX, Arm dot)."""
    from torch_fl.bpu.runtime.sim_kernels import cpu_flags, has_int32_dot

    return has_int32_dot(cpu_flags())


def _cos(a, b) -> float:
    import torch

    return torch.nn.functional.cosine_similarity(
        a.flatten().double(), b.flatten().double(), dim=0
    ).item()


def _interleaved_medians(fns: dict, iters: int, warmup: int = 2) -> dict[str, float]:
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(iters):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - t0) * 1e3)
    return {k: statistics.median(v) for k, v in samples.items()}


def run_model(
    name: str, scale: str, iters: int, timing: bool, inductor: bool, cache: str, kernels: str
) -> dict:
    import torch

    import torch_fl.bpu as bpu
    from tests.support.zoo import build
    from torch_fl.bpu import report

    model, x = build(name, scale)
    row: dict = {"model": name, "input": list(x.shape)}
    with torch.no_grad():
        row["graph_breaks"] = report.graph_breaks(model, x)
    with torch.no_grad():
        ref = model(x)
    base = {"cache_dir": cache, "sim_threads": 1, "sim_kernels": kernels}

    torch._dynamo.reset()
    with report.collect() as reps, torch.no_grad():
        out = torch.compile(model, backend="bpu", options={**base, "executor": "eager"})(x)
    rep = report.Report(list(reps))
    row["coverage_pct"] = rep.coverage_pct
    row["partitions"] = len(rep.partitions)
    row["graphs"] = len(rep.graphs)
    row["eager_max_abs_err"] = (out - ref).abs().max().item()
    cpu = {}
    for node in rep.cpu_nodes:
        cpu[node["target"]] = node["reason"]
    row["cpu_ops"] = cpu

    torch._dynamo.reset()
    # the default-scale column is what an uncalibrated int8 graph computes: calibrate="none"
    # (the backend's own default calibrates on the first call instead)
    sim = torch.compile(
        model, backend="bpu", options={**base, "executor": "sim", "calibrate": "none"}
    )
    try:
        with torch.no_grad(), report.collect() as sim_reps, warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*default activation scale")
            row["cosine_default"] = _cos(sim(x), ref)
    except Exception as exc:  # keep the coverage numbers of a model whose export fails
        row["error"] = f"sim: {type(exc).__name__}: {str(exc)[:200]}"
        return row
    generator = torch.Generator().manual_seed(7)
    samples = [torch.randn(x.shape, generator=generator) for _ in range(8)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bpu.calibrate(sim, samples)
        with torch.no_grad():
            row["cosine_calibrated"] = _cos(sim(x), ref)
    row["quant_warnings"] = [str(w.message) for w in caught if "quantization" in str(w.message)]
    row["health"] = [p.quant_health for g in sim_reps for p in g.partitions]
    row["sim_kernels"] = sorted(
        {p.sim_kernels["path"] for g in sim_reps for p in g.partitions if p.sim_kernels}
    )
    row["health_cosine_min"] = min((h["cosine"] for h in row["health"] if h), default=None)
    row["targets"] = {
        "no_graph_breaks": not row["graph_breaks"],
        "coverage": row["coverage_pct"] >= COVERAGE_TARGET,
        "partitions": row["partitions"] <= PARTITION_TARGET,
        "cosine_calibrated": row["cosine_calibrated"] >= COSINE_TARGET,
    }
    if timing:
        torch.set_num_threads(1)
        fns = {"eager_fp32": lambda: model(x), "sim": lambda: sim(x)}
        if inductor:
            torch._dynamo.reset()
            ind = torch.compile(model, backend="inductor")
            with torch.no_grad():
                ind(x)
            fns["inductor"] = lambda: ind(x)
            torch._dynamo.reset()
            sim = torch.compile(model, backend="bpu", options={**base, "executor": "sim"})
            bpu.calibrate(sim, samples)
            fns["sim"] = lambda: sim(x)
        with torch.no_grad():
            row["latency_ms"] = _interleaved_medians(fns, iters)
        lat = row["latency_ms"]
        row["sim_speedup_vs_eager"] = lat["eager_fp32"] / lat["sim"]
        if name in SPEED_TARGETS:
            target = SPEED_TARGETS[name][0 if cpu_has_vnni() else 1]
            row["targets"][f"sim_{target}x_eager"] = row["sim_speedup_vs_eager"] >= target
            if "inductor" in lat:
                row["targets"]["sim_faster_than_inductor"] = lat["sim"] < lat["inductor"]
    return row


def _table(rows: list[dict]) -> str:
    head = (
        f"{'model':<20} {'cov%':>6} {'parts':>5} {'eager err':>9} {'cos def':>8} {'cos cal':>8} "
        f"{'fp32 ms':>8} {'ind ms':>8} {'sim ms':>8}  targets"
    )
    lines = [head]
    for r in rows:
        if "error" in r:
            cov = f"{r['coverage_pct']:6.1f} {r['partitions']:5d} " if "coverage_pct" in r else ""
            lines.append(f"{r['model']:<20} {cov}ERROR {r['error'][:150]}")
            continue
        lat = r.get("latency_ms", {})

        def ms(key, lat=lat):
            return f"{lat[key]:8.2f}" if key in lat else f"{'-':>8}"

        missed = [k for k, ok in r["targets"].items() if not ok]
        lines.append(
            f"{r['model']:<20} {r['coverage_pct']:6.1f} {r['partitions']:5d} "
            f"{r['eager_max_abs_err']:9.1e} {r['cosine_default']:8.4f} "
            f"{r['cosine_calibrated']:8.5f} {ms('eager_fp32')} {ms('inductor')} {ms('sim')}  "
            + ("all met" if not missed else "missed: " + ", ".join(missed))
        )
    return "\n".join(lines)


def _plot(rows: list[dict], path: Path) -> bool:
    plt = plots.pyplot()
    if plt is None:
        return False
    ok = [r for r in rows if "error" not in r]
    names = [r["model"] for r in ok]
    timed = any(r.get("latency_ms") for r in ok)  # --no-timing: the accuracy panel alone
    if timed:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
        keys = ("eager_fp32", "inductor", "sim")
        latency = {k: [r.get("latency_ms", {}).get(k, 0.0) for r in ok] for k in keys}
        plots.grouped_bars(ax1, names, latency, rotation=45, ha="right")
        ax1.set_ylabel("ms per call, 1 thread (median)")
        ax1.set_title("latency")
        ax1.legend()
    else:
        fig, ax2 = plt.subplots(1, 1, figsize=(7, 4.5))
    cosines = {k: [max(0.0, r[k]) for r in ok] for k in ("cosine_default", "cosine_calibrated")}
    plots.grouped_bars(ax2, names, cosines, rotation=45, ha="right")
    ax2.axhline(COSINE_TARGET, color="k", lw=0.8, ls="--")
    ax2.set_ylim(0.9, 1.0005)
    ax2.set_title("sim cosine vs fp32")
    ax2.legend()
    plots.save(plt, fig, path)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=("bench", "test"), default="bench")
    parser.add_argument("--models", default="", help="comma separated (default: the whole zoo)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json", default=str(ROOT / "out" / "bench_zoo.json"))
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--no-inductor", action="store_true")
    parser.add_argument(
        "--sim-kernels",
        default="auto",
        choices=("auto", "u8s8", "mixed", "u8u8", "float"),
        help="the sim executor's kernel path (mixed: what a CPU without VNNI runs)",
    )
    args = parser.parse_args(argv)

    import torch

    from tests.support.zoo import ZOO

    torch.set_num_threads(1)
    # nn.GRU/LSTM are traced (not a graph break): what docs/compile-models.md tells users to set
    torch._dynamo.config.allow_rnn = True
    names = [n for n in args.models.split(",") if n] or list(ZOO)
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; the zoo has {', '.join(ZOO)}")
    rows = []
    cache = tempfile.mkdtemp(prefix="bench-zoo-cache-")
    print(_table([]), flush=True)  # the header; each model's row follows as it finishes
    for name in names:
        t0 = time.perf_counter()
        try:
            row = run_model(
                name,
                args.scale,
                args.iters,
                not args.no_timing,
                not args.no_inductor,
                cache,
                args.sim_kernels,
            )
        except Exception as exc:  # one broken model must not hide the others' numbers
            row = {"model": name, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            traceback.print_exc()
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
        print(_table([row]).splitlines()[-1], flush=True)
    for r in rows:
        if r.get("cpu_ops"):
            print(f"{r['model']}: on the CPU: " + "; ".join(f"{t}" for t in r["cpu_ops"]))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    from torch_fl.bpu.runtime.sim_kernels import choose

    kernels = choose(args.sim_kernels)
    meta = {
        "scale": args.scale,
        "threads": 1,
        "vnni": cpu_has_vnni(),
        "sim_kernels": {"path": kernels.path, "reason": kernels.reason},
        "torch": torch.__version__,
    }
    out.write_text(json.dumps({**meta, "models": rows}, indent=1))
    png = out.with_suffix(".png")
    plotted = _plot(rows, png)
    print(f"sim kernels: {kernels.path} ({kernels.reason})")
    print(f"wrote {out}" + (f" and {png}" if plotted else " (no matplotlib: no plot)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

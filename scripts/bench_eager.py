"""Eager flagos vs CPU: the cost of running every op through the (zero-copy) CPU fallback.

Prints flagos/CPU time ratios measured in this one process, for the zero-copy fallback and for
the classic copying fallback, plus the fixed per-call overhead of a small op.

    python scripts/bench_eager.py [--json out.json] [--repeat 30]

Targets: 1M-element add <= 1.2x CPU; <= 15 us extra per small op.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

import torch_fl
from torch_fl import atomic


def interleaved_medians(fns: list[Callable[[], object]], repeat: int, inner: int) -> list[float]:
    """Median seconds per call of each fn, measured round-robin so drift hits all alike."""
    for fn in fns:
        for _ in range(3):
            fn()
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            samples[i].append((time.perf_counter() - start) / inner)
    return [statistics.median(s) for s in samples]


def with_mode(mode: str, fn: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        torch_fl._C._set_fallback_mode(mode)
        try:
            return fn()
        finally:
            torch_fl._C._set_fallback_mode("zero-copy")

    return run


def workloads() -> dict[str, tuple[Callable[[str], Callable[[], object]], int]]:
    g = torch.Generator().manual_seed(0)
    a1m, b1m = torch.randn(1 << 20, generator=g), torch.randn(1 << 20, generator=g)
    m1, m2 = torch.randn(512, 512, generator=g), torch.randn(512, 512, generator=g)
    x, w = torch.randn(1, 16, 64, 64, generator=g), torch.randn(16, 16, 3, 3, generator=g)
    s1, s2 = torch.randn(16, generator=g), torch.randn(16, generator=g)

    def make(fn, *tensors):
        def factory(device: str):
            moved = [t.to(device) for t in tensors]
            return lambda: fn(*moved)

        return factory

    return {
        "add 1M": (make(torch.add, a1m, b1m), 5),
        "matmul 512x512": (make(torch.matmul, m1, m2), 2),
        "conv 3x3 16ch 64x64": (
            make(lambda a, b: torch.nn.functional.conv2d(a, b, padding=1), x, w),
            2,
        ),
        "add 16 (small op)": (make(torch.add, s1, s2), 200),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write results here")
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args(argv)

    results = []
    for name, (factory, inner) in workloads().items():
        cpu, zero, copy = interleaved_medians(
            [factory("cpu"), factory("flagos"), with_mode("copy", factory("flagos"))],
            args.repeat,
            inner,
        )
        results.append(
            {
                "workload": name,
                "cpu_us": cpu * 1e6,
                "flagos_zero_copy_us": zero * 1e6,
                "flagos_copy_us": copy * 1e6,
                "ratio_zero_copy": zero / cpu,
                "ratio_copy": copy / cpu,
                "extra_us_zero_copy": (zero - cpu) * 1e6,
            }
        )

    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
        f"memory backend {torch.flagos.memory_backend()}, pid {os.getpid()}"
    )
    header = f"{'workload':<22}{'cpu us':>10}{'zero-copy us':>14}{'ratio':>8}{'copy us':>10}{'ratio':>8}{'extra us':>10}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r['workload']:<22}{r['cpu_us']:>10.1f}{r['flagos_zero_copy_us']:>14.1f}"
            f"{r['ratio_zero_copy']:>8.2f}{r['flagos_copy_us']:>10.1f}{r['ratio_copy']:>8.2f}"
            f"{r['extra_us_zero_copy']:>10.1f}"
        )
    add = next(r for r in results if r["workload"] == "add 1M")
    small = next(r for r in results if r["workload"].startswith("add 16"))
    print(
        f"\ntargets: add 1M ratio {add['ratio_zero_copy']:.2f} (<= 1.2: "
        f"{'met' if add['ratio_zero_copy'] <= 1.2 else 'MISSED'}); small-op overhead "
        f"{small['extra_us_zero_copy']:.1f} us (<= 15: "
        f"{'met' if small['extra_us_zero_copy'] <= 15 else 'MISSED'})"
    )
    if args.json:
        atomic.write_text(args.json, json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

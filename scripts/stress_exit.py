"""Exit races under load: how often a fresh interpreter that ran a flagos backward dies at exit.

Runs the autograd exit case (allocate on flagos, backward, fall off the end of the script) as
many fresh interpreters, several at a time, next to busy-loop processes that keep the cores
contended, with the exit barrier of torch_fl/autograd_exit.py on and, interleaved in the same
run, off (`FLAGOS_EXIT_DRAIN=0`, the baseline). Prints the crash count of each.

    python scripts/stress_exit.py [--runs 100] [--parallel 3] [--busy 1] [--ucp-lib PATH]

A crash is a non-zero exit status or crash text on stderr. Before the barrier existed, about 1
run in 50 died with "terminate called without an active exception" on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CASE = (
    "import torch, torch_fl\n"
    "w = torch.randn(8, 8, device='flagos', requires_grad=True)\n"
    "(w @ w).sum().backward()\n"
    "g = w.grad\n"
)
CRASH_TEXT = ("terminate called", "double free", "corruption", "Segmentation fault")
BUSY = "while True: pass"


def run_once(drain: bool, ucp_lib: str) -> tuple[bool, str]:
    env = {
        **os.environ,
        "PYTHONWARNINGS": "ignore",
        "FLAGOS_EXIT_DRAIN": "1" if drain else "0",
        "FLAGOS_BPU_UCP_LIB": ucp_lib,
    }
    done = subprocess.run(
        [sys.executable, "-c", CASE], env=env, capture_output=True, text=True, timeout=300
    )
    crashed = done.returncode != 0 or any(text in done.stderr for text in CRASH_TEXT)
    return crashed, done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100, help="interpreters per mode")
    parser.add_argument("--parallel", type=int, default=3, help="interpreters at a time")
    parser.add_argument("--busy", type=int, default=1, help="busy-loop processes alongside")
    parser.add_argument("--ucp-lib", default="", help="libhbucp (or the stand-in) to load")
    parser.add_argument("--json", type=Path, help="also write the counts here")
    args = parser.parse_args()
    if args.runs < 1 or args.parallel < 1 or args.busy < 0:
        parser.error("--runs and --parallel must be >= 1 and --busy >= 0")

    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(args.busy)]
    modes = [True, False] * args.runs  # interleaved: load drift hits both modes alike
    start = time.perf_counter()
    try:
        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            results = list(pool.map(lambda drain: (drain, *run_once(drain, args.ucp_lib)), modes))
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    elapsed = time.perf_counter() - start

    counts = {}
    print(f"{'exit barrier':<14}{'runs':>6}{'crashes':>9}{'rate':>8}  last crash text")
    for drain, label in ((True, "on"), (False, "off (baseline)")):
        mine = [r for r in results if r[0] is drain]
        crashes = [r for r in mine if r[1]]
        text = crashes[-1][2] if crashes else ""
        rate = len(crashes) / len(mine)
        counts[label] = {"runs": len(mine), "crashes": len(crashes), "last": text}
        print(f"{label:<14}{len(mine):>6}{len(crashes):>9}{rate:>8.1%}  {text}")
    print(
        f"{len(results)} interpreters in {elapsed:.0f} s, {args.parallel} at a time, "
        f"{args.busy} busy loop(s)"
    )
    if args.json:
        args.json.write_text(json.dumps(counts, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Exit races under load: how often a fresh interpreter that ran a flagos backward dies at exit.

Runs the autograd exit case (allocate on flagos, backward, fall off the end of the script) as
many fresh interpreters, several at a time, next to busy-loop processes that keep the cores
contended, with the exit barrier of torch_fl/autograd_exit.py on and, interleaved in the same
run, off (`FLAGOS_EXIT_DRAIN=0`, the baseline). Prints the crash count of each.

    python scripts/stress_exit.py [--runs 60] [--parallel 1] [--busy 0] [--plain]
                                  [--ucp-lib PATH] [--json PATH]

A crash is a non-zero exit status or crash text on stderr; a slow exit (over 8 s) is counted
too, because it means the engine waited out its 10 s shutdown limit for a stuck device thread.
The race needs the main thread to run before the device thread drops its GraphTask, and to
keep the GIL until it finalises. Load alone makes that rare (about 1 run in 50 on a busy 2-core
machine, `--plain`). By default each child is amplified: pinned to one CPU (the woken main
thread runs first) with a 10 s switch interval (it keeps the GIL): 18 of 20 runs, one at a time.
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
    "import os, sys, torch, torch_fl\n"
    "if {amplify}:\n"
    "    os.sched_setaffinity(0, {{min(os.sched_getaffinity(0))}})\n"
    "    sys.setswitchinterval(10)\n"
    "w = torch.randn(8, 8, device='flagos', requires_grad=True)\n"
    "(w @ w).sum().backward()\n"
    "g = w.grad\n"
)
CRASH_TEXT = ("terminate called", "double free", "corruption", "Segmentation fault")
BUSY = "while True: pass"
SLOW_S = 8.0  # the engine's shutdown wait is 10 s: a run this slow waited on a stuck thread


def run_once(drain: bool, ucp_lib: str, amplify: bool) -> tuple[bool, bool, str]:
    env = {
        **os.environ,
        "PYTHONWARNINGS": "ignore",
        "FLAGOS_EXIT_DRAIN": "1" if drain else "0",
        "FLAGOS_BPU_UCP_LIB": ucp_lib,
    }
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CASE.format(amplify=amplify)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    slow = time.perf_counter() - started > SLOW_S
    crashed = done.returncode != 0 or any(text in done.stderr for text in CRASH_TEXT)
    return crashed, slow, done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=60, help="interpreters per mode")
    parser.add_argument("--parallel", type=int, default=1, help="interpreters at a time")
    parser.add_argument("--busy", type=int, default=0, help="busy-loop processes alongside")
    parser.add_argument(
        "--plain",
        action="store_true",
        help="children without the amplification (one CPU, 10 s switch interval)",
    )
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
            results = list(
                pool.map(
                    lambda drain: (drain, *run_once(drain, args.ucp_lib, not args.plain)),
                    modes,
                )
            )
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    elapsed = time.perf_counter() - start

    counts = {}
    print(f"{'exit barrier':<15}{'runs':>5}{'crashes':>9}{'rate':>8}{'slow':>6}  last crash text")
    for drain, label in ((True, "on"), (False, "off (baseline)")):
        mine = [r for r in results if r[0] is drain]
        crashes = [r for r in mine if r[1]]
        slow = sum(1 for r in mine if r[2])
        text = crashes[-1][3] if crashes else ""
        rate = len(crashes) / len(mine)
        counts[label] = {"runs": len(mine), "crashes": len(crashes), "slow": slow, "last": text}
        print(f"{label:<15}{len(mine):>5}{len(crashes):>9}{rate:>8.1%}{slow:>6}  {text}")
    print(
        f"{len(results)} interpreters in {elapsed:.0f} s, {args.parallel} at a time, "
        f"{args.busy} busy loop(s), {'plain' if args.plain else 'amplified'} children"
    )
    if args.json:
        args.json.write_text(json.dumps(counts, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`invoke build` and `invoke bench`: the C++ extension and the eager-device benchmark."""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
from pathlib import Path

from invoke import Collection, Context, task
from invoke.exceptions import Exit

from provision.floor import light
from scripts.tasks.cli import CliTask, check_output_file, heartbeat, print_lines

ROOT = Path(__file__).resolve().parents[2]
SUPPORTED_ACCELERATORS: tuple[str, ...] = light.load("targets").ACCELERATORS


@task(
    klass=CliTask,
    help={
        "accelerator": f"which accelerator to build for: {', '.join(SUPPORTED_ACCELERATORS)}",
        "debug": "build with -O0 -g instead of -O2 without debug info",
    },
)
def build(c: Context, accelerator: str = "bpu", debug: bool = False) -> None:
    """Build the torch_fl C++ extension in place against the installed torch."""
    if accelerator not in SUPPORTED_ACCELERATORS:
        raise Exit(
            f"unknown accelerator {accelerator!r}; supported: {', '.join(SUPPORTED_ACCELERATORS)}"
            " (example: invoke build --accelerator bpu)",
            code=2,
        )
    try:
        # setup.py refuses a bad MAX_JOBS too, but deep inside pip's output: say it in one line
        light.load("unity_build").compile_jobs()
    except ValueError as exc:
        raise Exit(str(exc), code=2) from None
    env = {"ACCELERATOR": accelerator, "FLAGOS_BUILD_DEBUG": "1" if debug else "0"}
    # No build isolation: pip must compile against the torch already installed, never fetch one.
    with c.cd(str(ROOT)), heartbeat(f"build {accelerator}"):
        c.run(
            f"{sys.executable} -m pip install --no-build-isolation --no-deps -q -e .",
            env=env,
            pty=False,
        )
        c.run(
            f'{sys.executable} -c "import torch_fl, json; print(json.dumps(torch_fl.build_info()))"',
            env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
        )


@task(
    klass=CliTask,
    honours_dry=True,  # every step is a c.run: --dry echoes them
    help={
        "json": "also write the eager results as JSON to this file (- for standard output)",
        "quick": "a one-minute check: eager, one zoo model, one sim-vs-ONNX-Runtime row",
    },
)
def bench(c: Context, json: str | None = None, quick: bool = False) -> None:
    """Benchmarks: eager flagos vs CPU, the compile backend, and the zoo (scripts/bench_*.py)."""
    to_stdout = json == "-"
    if json is not None and not to_stdout:
        # `--json ''` is refused (exit 2), and a relative path is the user's, not the repo's:
        # the scripts run in the checkout
        json = str(check_output_file("--json", json).resolve())
    # `--json -`: standard output carries the JSON alone; the benchmarks' tables go to stderr.
    streams = {"out_stream": sys.stderr} if to_stdout else {}
    # --quick: the same scripts and the same ratios, on a budget (numbers for docs come from a
    # full run); its JSON goes to out/quick/ so a full run's files are never overwritten
    steps = [
        ("bench_eager.py", " --repeat 3" if quick else ""),
        # bench_compile's fresh-process compile and cache-hit timings take a minute alone: full
        # runs only (bench_sim's breakdown shows the per-call overhead and the weight check)
        ("bench_compile.py", None if quick else ""),
        ("bench_zoo.py", " --scale test --iters 3 --models resnet18 --no-inductor"
         " --json out/quick/bench_zoo.json" if quick else ""),
        ("bench_sim.py", " --models transformer_encoder --batches 1 --threads 1"
         " --iters 3 --no-inductor --no-pt2e --calib-samples 4 --json out/quick/bench_sim.json"
         if quick
         else " --json out/bench_sim.json"),
        ("bench_conv_ops.py", None if quick else " --json out/bench_conv_ops.json"),
        ("bench_public_zoo.py", None if quick else " --json out/bench_public_zoo.json"),
        ("bench_trained.py", None if quick else " --json out/bench_trained.json"),
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, c.cd(str(ROOT)):
        dest = str(Path(tmp) / "eager.json") if to_stdout else json
        out = f" --json {shlex.quote(dest)}" if dest else ""
        for script, extra in steps:
            if extra is None or not (ROOT / "scripts" / script).exists():
                continue  # bench_public_zoo: minutes of ONNX Runtime quantization per model
            flags = out + extra if script == "bench_eager.py" else extra
            c.run(f"{sys.executable} scripts/{script}{flags}", env=dict(os.environ), **streams)
        if to_stdout:
            print_lines(Path(dest).read_text(encoding="utf-8").splitlines())


def register(ns: Collection) -> None:
    """Add build and bench to the root collection."""
    ns.add_task(build)
    ns.add_task(bench)

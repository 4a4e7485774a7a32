"""Which executor runs a partition: the one registry of executor kinds, and the plan.

`EXECUTORS` maps each kind ("hbm", "sim", "eager") to how to build it from a finished
`build.BuildResult` and what its weights need; `PartitionRuntime` looks kinds up here and never
branches on their names. `plan_executor` turns the `executor` setting ("auto" included) into the
kind every partition of a graph uses, and says why.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from torch_fl.bpu.build import BuildResult, PartitionSpec
from torch_fl.bpu.errors import ExecutorUnavailableError
from torch_fl.bpu.runtime import sim_kernels, sim_threads
from torch_fl.bpu.runtime.executors import (
    EagerExecutor,
    Executor,
    HbmExecutor,
    SimExecutor,
    hbm_runtime_available,
)
from torch_fl.bpu.runtime.sim_kernels import KernelChoice
from torch_fl.bpu.settings import BpuSettings


@dataclass(frozen=True)
class ExecutorKind:
    """How one kind of executor is made, and what it asks of the build and the weights."""

    name: str
    needs_hbm: bool
    """The build must produce a compiled .hbm artifact (not just the Q/DQ ONNX graph)."""
    make: Callable[[PartitionSpec, BpuSettings, BuildResult], Executor]
    baked_weights: Callable[[BpuSettings], bool]
    """The executor holds the weights as they were at build time: the runtime checks them
    before each call and rebuilds when they changed. False: it reads them live on every call."""


def _make_sim(spec: PartitionSpec, settings: BpuSettings, result: BuildResult) -> Executor:
    live = settings.sim_weights == "live"
    if live:
        # weights computed in the graph every call: ORT cannot pre-pack them for int8 kernels
        kernels = KernelChoice("float", "sim_weights='live': weights quantized in the graph")
    elif not settings.quantize:
        kernels = KernelChoice("float", "quantize=False: a float graph")
    else:
        kernels = sim_kernels.choose(settings.sim_kernels)
    threads, candidates = settings.sim_threads, ()
    if settings.sim_thread_choice == "measured":
        # opened at the most it may use; the first call times the others (sim_threads.py)
        candidates = sim_threads.candidates(threads, sim_threads.usable_cpus())
        threads = candidates[-1]
    return SimExecutor(
        result.live_bytes if live else result.onnx_bytes,
        threads,
        list(zip(spec.input_names, spec.runtime_positions, strict=True)),
        list(zip(spec.weight_names, spec.frozen_positions, strict=True)) if live else (),
        kernels,
        candidates if len(candidates) > 1 else (),
        lookups=settings.sim_lookups,
        depthwise=settings.sim_depthwise,
        narrow=settings.sim_narrow_op,
        pair_gemm=settings.sim_pair_gemm,
        stop_spinning=spec.graph_partitions > 1,
    )


def _make_hbm(spec: PartitionSpec, settings: BpuSettings, result: BuildResult) -> Executor:
    return HbmExecutor(result.hbm_path, spec.input_names, spec.output_names, spec.runtime_positions)


def make_executor(
    kind: ExecutorKind, spec: PartitionSpec, settings: BpuSettings, result: BuildResult
) -> Executor:
    """`kind.make`, then drop the build's uncached .hbm: whichever executor was made (hbm loads
    it at construction; sim and eager with compile_artifact='always' never read it), and whether
    or not making it failed, nothing is left in the temporary directory."""
    try:
        return kind.make(spec, settings, result)
    finally:
        if result.temporary and result.hbm_path:
            shutil.rmtree(os.path.dirname(result.hbm_path), ignore_errors=True)


def _make_eager(spec: PartitionSpec, settings: BpuSettings, result: BuildResult) -> Executor:
    return EagerExecutor(spec.gm)


EXECUTORS: dict[str, ExecutorKind] = {
    kind.name: kind
    for kind in (
        ExecutorKind("hbm", True, _make_hbm, lambda settings: True),
        # live: reads the weights on every call, never stale; checked: baked, compared
        ExecutorKind("sim", False, _make_sim, lambda settings: settings.sim_weights != "live"),
        ExecutorKind("eager", False, _make_eager, lambda settings: False),
    )
}

_warned_no_board = False


def plan_executor(settings: BpuSettings) -> tuple[str, str]:
    """The executor every partition of this graph will use, and why."""
    global _warned_no_board
    if settings.executor == "eager":
        return "eager", "executor='eager' requested"
    if settings.executor == "sim":
        return "sim", ""
    board = hbm_runtime_available()
    if settings.executor == "hbm":
        if not board:
            raise ExecutorUnavailableError(
                "executor='hbm' needs the board runtime module hbm_runtime, which is not "
                "importable here. Fix: run on an RDK S-series board, or use executor='sim' to "
                "simulate the int8 numerics on this host"
            )
        return "hbm", ""
    if board:
        return "hbm", ""
    reason = "no BPU runtime (hbm_runtime) on this machine"
    if not _warned_no_board and not settings.strict:
        _warned_no_board = True
        warnings.warn(
            f"torch_fl.bpu: {reason}; BPU partitions run eagerly on the CPU (bit-exact). Use "
            "options={'executor': 'sim'} to run the int8 Q/DQ graph on the host, or "
            "options={'executor': 'eager'} to silence this warning.",
            stacklevel=2,
        )
    return "eager", reason

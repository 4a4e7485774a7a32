"""`torch.compile(model, backend="bpu")`: the registered backend function.

aot_autograd turns Dynamo's graph into aten ops. Only the *inference* graph reaches the BPU
pipeline (rewrite -> partition -> per-partition runtime); training forward and backward graphs
run on the host, because hbdk4 artifacts are inference-only and int8 forward numerics would
corrupt gradients. Which graph a grad-enabled call gets is decided in `gradmode`: an eval model
whose inputs do not require grad is compiled as inference.
"""

from __future__ import annotations

import functools
import logging
import sys
import warnings
from typing import Any

import torch
from torch import fx
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from torch_fl.bpu.build import PartitionSpec
from torch_fl.bpu.errors import BpuError, SettingsError, StrictModeError, through_dynamo
from torch_fl.bpu.gradmode import EVAL_INFERENCE, HOST_TRAINING, INFERENCE
from torch_fl.bpu.gradmode import plan as plan_grad_mode
from torch_fl.bpu.guards import use_dict_tag_guards
from torch_fl.bpu.lowering import apply_rewrites
from torch_fl.bpu.lowering.resize import keep_interpolate_whole
from torch_fl.bpu.partitioning import partition_graph
from torch_fl.bpu.report import GraphReport, PartitionEntry, Report, noting
from torch_fl.bpu.report import register as register_report
from torch_fl.bpu.runtime.partition import PartitionRuntime
from torch_fl.bpu.runtime.registry import plan_executor
from torch_fl.bpu.settings import BpuSettings, resolve
from torch_fl.bpu.shapes import StaticShapes, symbolic

log = logging.getLogger("torch_fl.bpu")
_graph_counter = 0
_warned_grad: set = set()


def _host_compiler(gm: fx.GraphModule, example_inputs):
    """Training forward/backward: plain host execution, never the BPU compiler."""
    return make_boxed_func(gm.forward)


def _host_forward_compiler(gm: fx.GraphModule, example_inputs, reason: str):
    """The training forward of a grad-mode call: runs on the host, and the report says so."""
    from torch_fl.bpu.partitioning.support import is_compute

    global _graph_counter
    cpu_nodes = [
        {"node": n.name, "target": str(n.target), "reason": reason}
        for n in gm.graph.nodes
        if is_compute(n)
    ]
    greport = GraphReport(
        _graph_counter,
        cpu_nodes=cpu_nodes,
        compute_total=len(cpu_nodes),
        grad_mode=HOST_TRAINING,
    )
    _graph_counter += 1
    greport.runtimes = []
    register_report(greport)
    return make_boxed_func(noting(greport, gm.forward))


def _shape(node: fx.Node):
    val = node.meta.get("val")
    return list(val.shape) if isinstance(val, torch.Tensor) else None


def _static_indices(n_inputs: int) -> set[int]:
    from torch._guards import TracingContext

    ctx = TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    indices = getattr(meta, "static_input_indices", None) or []
    return {i for i in indices if i < n_inputs}


def _partition(
    number: int,
    name: str,
    call: fx.Node,
    fused: fx.GraphModule,
    frozen_inputs: set[fx.Node],
    plan,
    kind: str,
) -> tuple[PartitionSpec, PartitionEntry]:
    """The spec a partition runtime is built from, and its row in the report."""
    sub = fused.get_submodule(name)
    sub_inputs = [n for n in sub.graph.nodes if n.op == "placeholder"]
    # Parameters/buffers (static inputs) and constants folded at compile time (get_attr).
    frozen = tuple(
        i
        for i, a in enumerate(call.args)
        if isinstance(a, fx.Node) and (a in frozen_inputs or a.op == "get_attr")
    )
    runtime_positions = tuple(i for i in range(len(call.args)) if i not in frozen)
    output = next(n for n in sub.graph.nodes if n.op == "output")
    outs = list(output.args[0])
    spec = PartitionSpec(
        index=number,
        name=name,
        gm=sub,
        frozen_positions=frozen,
        runtime_positions=runtime_positions,
        input_names=tuple(sub_inputs[i].name for i in runtime_positions),
        n_outputs=len(outs),
        graph_partitions=len(plan.partition_names),
    )
    entry = PartitionEntry(
        id=number,
        name=name,
        compute_nodes=plan.compute_counts[name],
        nodes=sum(1 for n in sub.graph.nodes if n.op == "call_function"),
        inputs=[_shape(sub_inputs[i]) for i in runtime_positions],
        outputs=[_shape(o) if isinstance(o, fx.Node) else None for o in outs],
        frozen_params=len(frozen),
        executor=kind,
        fingerprint=spec.fingerprint,
    )
    return spec, entry


def _generate_forward(gm: fx.GraphModule) -> None:
    """Generate `gm`'s code now. Dynamo hands the backend lazy graph modules, whose `forward`
    until then is a stand-in that generates the code on first use and then goes through
    `gm(...)` on every call: five Python frames and nn.Module's call machinery per call, which
    after an int8 session has emptied the caches is measurable (tests/compile/test_hot_path.py)."""
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule
    except ImportError:  # a torch without lazy graph modules: recompile() generated it already
        return
    force = getattr(_LazyGraphModule, "force_recompile", None)
    if force is not None:
        force(gm)


def compile_inference(
    gm: fx.GraphModule, example_inputs, settings: BpuSettings, grad_mode: str = INFERENCE
):
    """The BPU pipeline for one inference graph. Runs under fake mode: no real tensor work."""
    global _graph_counter
    graph_id = _graph_counter
    _graph_counter += 1
    static = _static_indices(len(example_inputs))
    rewrites = apply_rewrites(gm)
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    plan = partition_graph(gm, settings.min_partition_ops, [inputs[i] for i in static])
    fused = plan.graph_module
    greport = GraphReport(
        graph_id,
        cpu_nodes=[vars(r) for r in plan.rejected],
        compute_total=plan.total_compute,
        rewrites=dict(rewrites),
        grad_mode=grad_mode,
    )
    greport.runtimes = []  # not a dataclass field: kept out of JSON, used by tests/tools
    if settings.strict and plan.blockers:
        details = "; ".join(f"{r.node} ({r.target}): {r.reason}" for r in plan.rejected)
        raise StrictModeError(f"strict: nodes not offloaded to the BPU: {details}")
    kind, reason = plan_executor(settings)
    if settings.strict and kind == "eager":
        raise StrictModeError(
            f"strict: partitions would run eagerly on the CPU ({reason}). Fix: run on a board, "
            "or use executor='sim' to accept the host simulation as offloaded"
        )

    placeholders = [n for n in fused.graph.nodes if n.op == "placeholder"]
    frozen_inputs = {n for i, n in enumerate(placeholders) if i in static}
    calls = {n.target: n for n in fused.graph.nodes if n.op == "call_module"}
    for number, name in enumerate(plan.partition_names):
        spec, entry = _partition(number, name, calls[name], fused, frozen_inputs, plan, kind)
        greport.partitions.append(entry)
        part = PartitionRuntime(spec, settings, kind, reason, entry)
        greport.runtimes.append(part)
        fused.add_submodule(name, part)
    fused.recompile()
    _generate_forward(fused)
    fused.bpu_report = greport
    register_report(greport)
    if settings.report != "none":
        text = Report([greport])
        print(text.table() if settings.report == "table" else text.to_json(), file=sys.stderr)
    log.info("bpu graph %d: %d partition(s)", graph_id, len(plan.partition_names))
    return make_boxed_func(noting(greport, fused.forward))


def bpu_backend(
    gm: fx.GraphModule,
    example_inputs,
    options: dict[str, Any] | None = None,
    mode: str | None = None,
):
    """torch.compile backend "bpu"; `options` are documented in torch_fl.bpu.settings.

    `mode` (torch.compile's `mode=`, e.g. "max-autotune") is accepted and changes nothing: the
    BPU compiler's own effort is `options={"opt_level": ...}`. Errors of ours surface through
    torch.compile as themselves (`except torch_fl.bpu.BpuError` catches them), not wrapped in
    Dynamo's BackendCompilerFailed.
    """
    try:
        if mode is not None and not isinstance(mode, str):
            raise SettingsError(
                f"bpu backend: torch.compile(mode=...) must be a string, got {type(mode).__name__}"
            )
        if mode not in (None, "default"):
            log.info("bpu: torch.compile(mode=%r) has no effect on this backend", mode)
        settings = resolve(options)
        use_dict_tag_guards(settings.fast_guards)
        grad = plan_grad_mode(gm, example_inputs)
        if grad.mode != HOST_TRAINING and symbolic(example_inputs):
            return StaticShapes(gm, settings, grad, _compile_graph)
        return _compile_graph(gm, example_inputs, settings, grad)
    except BpuError as exc:
        raise through_dynamo(exc) from exc.__cause__


def _compile_graph(gm: fx.GraphModule, example_inputs, settings: BpuSettings, grad):
    """One Dynamo graph with static shapes (or a training graph, which runs on the host)."""
    if grad.mode != HOST_TRAINING:
        keep_interpolate_whole(gm)
    inference = functools.partial(compile_inference, settings=settings, grad_mode=grad.mode)
    if grad.mode == HOST_TRAINING:
        if settings.strict:
            raise StrictModeError(f"strict: nothing offloaded to the BPU: {grad.reason}")
        if grad.key not in _warned_grad:
            _warned_grad.add(grad.key)
            warnings.warn(f"torch_fl.bpu: nothing offloaded: {grad.reason}", stacklevel=2)
    fw_compiler = functools.partial(_host_forward_compiler, reason=grad.reason)
    compiler = aot_autograd(
        fw_compiler=fw_compiler, bw_compiler=_host_compiler, inference_compiler=inference
    )
    if grad.mode != EVAL_INFERENCE:
        return compiler(gm, example_inputs)
    # An eval model called with grad enabled: compile and run the inference graph, as if the
    # call were under torch.no_grad() (its outputs do not require grad).
    log.info("bpu: grad enabled on a model in eval mode; compiling the inference graph")
    with torch.no_grad():
        compiled = compiler(gm, example_inputs)

    def run_without_grad(*args):
        with torch.no_grad():
            return compiled(*args)

    return run_without_grad


def register() -> None:
    """Register "bpu" with Dynamo unless it is already known (entry point or earlier import)."""
    from torch._dynamo.backends import registry

    if "bpu" in registry._COMPILER_FNS:
        return
    if registry._BACKENDS.get("bpu") is not None:
        # Known through the torch_dynamo_backends entry point: lookup_backend() loads and
        # registers it itself, and registering here too would be a duplicate-name error.
        return
    registry.register_backend(bpu_backend, name="bpu")


register()

"""What a call with autograd enabled runs: the BPU inference graph, or the host training graph.

aot_autograd builds a training graph whenever grad mode is on and any graph input requires grad,
and parameters always do. Taken literally, `compiled(x)` outside `torch.no_grad()` would then
never reach the BPU, although that is how most people call an inference model. The rule a user
expects: a model in eval mode whose call inputs do not require grad is doing inference, so its
graph is compiled and run as the inference graph (outputs do not require grad, exactly as under
`torch.no_grad()`). A module in training mode, or a call input that requires grad (input
gradients, adversarial examples), keeps the host training graph; that is reported and warned
about, and refused under strict mode.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import fx

INFERENCE = "inference"  # grad mode off, or nothing requires grad: aot_autograd's own choice
EVAL_INFERENCE = "eval-inference"  # grad mode on, eval model, no call input needs grad
HOST_TRAINING = "host-training"  # a real training graph: stays on the host

FIX = (
    "Fix: call the model under torch.no_grad() or torch.inference_mode(), or put it in eval "
    "mode (model.eval()) and pass inputs that do not require grad"
)


@dataclass(frozen=True)
class GradPlan:
    mode: str
    reason: str = ""
    key: object = None  # identifies the compiled model, so it is warned about once


def _is_module_state(source) -> bool:
    """A placeholder fed from a module's parameters/buffers, not from the call's arguments."""
    from torch._dynamo.source import ParamBufferSource, is_from_unspecialized_param_buffer_source

    node = source
    while node is not None:
        if isinstance(node, ParamBufferSource):
            return True
        node = getattr(node, "base", None)
    return bool(source is not None and is_from_unspecialized_param_buffer_source(source))


def _resolve_root_module(source, f_locals: dict, f_globals: dict) -> torch.nn.Module | None:
    """The outermost nn.Module on a parameter's source chain (L['model']._modules[...]...)."""
    chain = []
    node = source
    while node is not None:
        chain.append(node)
        node = getattr(node, "base", None)
    obj = None
    for step in reversed(chain):
        if hasattr(step, "local_name"):
            obj = f_locals[step.local_name]
        elif hasattr(step, "global_name"):
            obj = f_globals[step.global_name]
        elif obj is None:
            return None
        elif isinstance(getattr(step, "member", None), str):
            obj = getattr(obj, step.member)
        elif isinstance(getattr(step, "index", None), (str, int)):
            obj = obj[step.index]
        # other chained sources (Unspecialized*Source wrappers) name the same object
        if isinstance(obj, torch.nn.Module):
            return obj
    return None


def _frame_namespaces() -> tuple[dict, dict] | None:
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
        return dict(tx.f_locals), dict(tx.f_globals)
    except Exception:  # no translator (a graph handed to the backend directly)
        return None


def plan(gm: fx.GraphModule, example_inputs) -> GradPlan:
    """Decide how the Dynamo graph `gm` is compiled in the current grad mode."""
    if not torch.is_grad_enabled():
        return GradPlan(INFERENCE)
    needs_grad = [
        i for i, t in enumerate(example_inputs) if isinstance(t, torch.Tensor) and t.requires_grad
    ]
    if not needs_grad:
        return GradPlan(INFERENCE)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    sources = []
    for node in placeholders:
        grapharg = node.meta.get("grapharg")
        sources.append(getattr(grapharg, "source", None))
    for i in needs_grad:
        source = sources[i] if i < len(sources) else None
        if source is None or not _is_module_state(source):
            name = source.name if source is not None else f"input {i}"
            return GradPlan(
                HOST_TRAINING,
                f"grad mode: {name} requires grad, so this graph is a training graph and runs on "
                f"the host. {FIX}",
                key=("graph", gm.code),
            )
    spaces = _frame_namespaces()
    roots: dict[int, torch.nn.Module] = {}
    if spaces is not None:
        for source in sources:
            if source is None or not _is_module_state(source):
                continue
            try:
                root = _resolve_root_module(source, *spaces)
            except (KeyError, AttributeError, IndexError, TypeError):
                root = None
            if root is not None:
                roots[id(root)] = root
    key = tuple(sorted(roots)) or ("graph", gm.code)
    if not roots:
        return GradPlan(
            HOST_TRAINING,
            "grad mode: parameters require grad and the model's train/eval mode could not be "
            f"determined, so this graph runs on the host as a training graph. {FIX}",
            key=key,
        )
    training = [type(m).__name__ for root in roots.values() for m in root.modules() if m.training]
    if training:
        return GradPlan(
            HOST_TRAINING,
            f"grad mode: the model is in training mode ({training[0]}.training is True) and "
            f"grad is enabled, so this graph runs on the host as a training graph. {FIX}",
            key=key,
        )
    return GradPlan(EVAL_INFERENCE, key=key)

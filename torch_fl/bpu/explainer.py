"""`explain(model, *inputs)`: what ran where, and why.

Given the object `torch.compile(model, backend="bpu")` returned, explain calls it on `inputs` and
reports the graphs that really ran for them (compiled earlier or now, with every partition's
executor, calibration and fallbacks as they are after earlier calls). Given a plain module, it
compiles a fresh copy with the bpu backend first.

Kept apart from `report` (the data the backend fills in) because it drives the backend: the
dependency runs explainer -> backend -> report, never back.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_fl.bpu.backend import bpu_backend
from torch_fl.bpu.errors import ExplainError
from torch_fl.bpu.report import Report, graph_breaks, ran


def _compiled_original(model: Any) -> torch.nn.Module | None:
    """The module inside a torch.compile'd module, or None for a plain one."""
    from torch._dynamo.eval_frame import OptimizedModule

    return model._orig_mod if isinstance(model, OptimizedModule) else None


def explain(model: Any, *inputs: Any, **options: Any) -> Report:
    """Run `model` once on `inputs` and return the coverage report of the graphs that ran.

    `model` is a module compiled with backend="bpu" (reported as it is) or a plain module
    (compiled fresh with `options`). The call runs in the caller's grad mode, so the report says
    what a call made the same way does: under grad mode a model in training mode runs on the
    host, and the report shows it.
    """
    original = _compiled_original(model)
    if original is not None and options:
        raise ExplainError(
            "explain: options apply only when explain compiles the model itself; pass the "
            "plain module with options, or the compiled one without"
        )
    if original is None:
        if not isinstance(model, torch.nn.Module) and not callable(model):
            raise ExplainError(
                f"explain: expected a module or a compiled module, got {type(model).__name__}"
            )
        compiled = torch.compile(model, backend=bpu_backend, options=options or None, dynamic=False)
        original = model
    else:
        compiled = model
    with ran() as seen:
        try:
            compiled(*inputs)
        except TypeError as exc:
            if inputs:
                raise
            # `explain(compiled)`: the model's own complaint about a missing argument would not
            # say that explain runs the model and needs what it takes
            raise ExplainError(
                f"explain: calling the model with no inputs failed ({exc}); explain runs the "
                "model once: pass its inputs, e.g. bpu.explain(compiled, x)"
            ) from exc
    graphs = list({id(g): g for g in seen}.values())
    if not graphs:
        raise ExplainError(
            "explain: no graph of this model reached the bpu backend; was it compiled with "
            "torch.compile(model, backend='bpu')? (another backend's compiled model cannot be "
            "explained; pass the plain module instead)"
        )
    return Report(graphs, graph_breaks(original, *inputs))

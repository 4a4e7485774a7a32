"""`explain(model, *inputs)`: compile with the bpu backend, run once, report what ran where.

Kept apart from `report` (the data the backend fills in) because it drives the backend: the
dependency runs explainer -> backend -> report, never back.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_fl.bpu.backend import bpu_backend
from torch_fl.bpu.errors import ExplainError
from torch_fl.bpu.report import Report, collect, graph_breaks


def explain(model: torch.nn.Module, *inputs: Any, **options: Any) -> Report:
    """Compile `model` with the bpu backend, run it once on `inputs`, return the coverage.

    The call runs in the caller's grad mode, so the report says what a call made the same way
    does: under grad mode a model in training mode runs on the host, and the report shows it.
    """
    compiled = torch.compile(model, backend=bpu_backend, options=options or None, dynamic=False)
    with collect() as reports:
        compiled(*inputs)
    if not reports:
        raise ExplainError(
            "explain: no graph reached the bpu backend (was the model already compiled and "
            "cached by Dynamo with other settings?); call torch._dynamo.reset() and retry"
        )
    return Report(list(reports), graph_breaks(model, *inputs))

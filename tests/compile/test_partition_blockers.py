"""Strict mode refuses rejected ops but not the getitem reads of a CPU tuple op (by identity)."""

from __future__ import annotations

import torch

from tests.compile.bpu_helpers import compile_bpu
from tests.compile.test_rewrites_partitioning import BnPool
from torch_fl.bpu import backend


def test_blockers_are_the_rejected_ops_without_getitems(monkeypatch):
    plans = []

    def recording(*args, **kwargs):
        plans.append(backend_partition(*args, **kwargs))
        return plans[-1]

    backend_partition = backend.partition_graph
    monkeypatch.setattr(backend, "partition_graph", recording)
    model = BnPool(return_indices=True).eval()
    with torch.no_grad():
        compile_bpu(model, executor="eager")(torch.randn(1, 3, 8, 8))
    (plan,) = plans
    rejected = {r.node: r.target for r in plan.rejected}
    blockers = {r.node for r in plan.blockers}
    getitems = {name for name, target in rejected.items() if "getitem" in target}
    assert getitems  # the CPU tuple op's outputs are read through getitem nodes
    assert "aten.max_pool2d_with_indices.default" in {r.target for r in plan.blockers}
    assert blockers == set(rejected) - getitems

"""Executors are looked up in one registry, and every kind the settings accept is in it."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from tests.compile.bpu_helpers import compile_bpu, runtimes
from tests.support.models import ConvStack, seeded
from torch_fl.bpu import backend, report
from torch_fl.bpu.runtime import registry
from torch_fl.bpu.runtime.executors import EagerExecutor, HbmExecutor, SimExecutor
from torch_fl.bpu.settings import EXECUTORS as SETTING_CHOICES
from torch_fl.bpu.settings import resolve


def test_registry_holds_every_executor_setting_but_auto():
    assert set(registry.EXECUTORS) == set(SETTING_CHOICES) - {"auto"}
    assert all(name == kind.name for name, kind in registry.EXECUTORS.items())
    assert registry.EXECUTORS["hbm"].needs_hbm
    assert not registry.EXECUTORS["sim"].needs_hbm


def test_backend_plans_through_the_registry():
    assert backend.plan_executor is registry.plan_executor
    assert registry.plan_executor(resolve({"executor": "sim"})) == ("sim", "")
    assert registry.plan_executor(resolve({"executor": "eager"}))[0] == "eager"


def test_weight_policy_per_kind():
    live, checked = resolve({"sim_weights": "live"}), resolve({"sim_weights": "checked"})
    assert not registry.EXECUTORS["sim"].baked_weights(live)
    assert registry.EXECUTORS["sim"].baked_weights(checked)
    assert registry.EXECUTORS["hbm"].baked_weights(live)
    assert not registry.EXECUTORS["eager"].baked_weights(checked)


@pytest.mark.parametrize(("kind", "cls"), [("sim", SimExecutor), ("eager", EagerExecutor)])
def test_partition_runs_the_registered_executor(kind, cls):
    model = seeded(ConvStack()).eval()
    x = torch.randn(1, 3, 8, 8)
    with report.collect() as reps, torch.no_grad():
        out = compile_bpu(model, executor=kind)(x)
    (rt,) = runtimes(reps)
    assert isinstance(rt._exec, cls) and rt._exec.kind == kind == rt.kind
    if kind == "eager":
        assert torch.equal(out, model(x))
    assert (rt._frozen is not None) == registry.EXECUTORS[kind].baked_weights(rt.settings)


def test_hbm_executor_picks_runtime_inputs_by_position(monkeypatch):
    # the protocol: every partition input in; hbm hands the board only the runtime ones (a
    # recording double of the board runtime, just enough to see the feed)
    seen = []

    class Runtime:
        model_names = ["m"]
        input_names = {"m": ["x"]}
        output_names = {"m": ["y"]}

        def __init__(self, path):
            pass

        def run(self, feed):
            seen.append(feed)
            return {"m": {"y": feed["x"] * 2}}

    module = types.ModuleType("hbm_runtime")
    module.HB_HBMRuntime = Runtime
    monkeypatch.setitem(sys.modules, "hbm_runtime", module)
    executor = HbmExecutor("unused.hbm", ["x"], ["y"], positions=[1])
    weight, x = torch.ones(3), torch.arange(3.0)
    (y,) = executor([weight, x])
    assert torch.equal(y, x * 2) and list(seen[0]) == ["x"]

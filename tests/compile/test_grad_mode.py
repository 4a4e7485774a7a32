"""Calls with autograd enabled: eval models offload, training graphs stay on the host and say so."""

import warnings

import pytest
import torch

import torch_fl.bpu as bpu
from tests.compile.bpu_helpers import compile_bpu, cosine
from tests.support.models import ConvStack, seeded
from torch_fl.bpu import report


def test_readme_call_without_no_grad_offloads():
    model = seeded(ConvStack(8))
    x = torch.randn(1, 3, 16, 16)
    assert torch.is_grad_enabled() and all(p.requires_grad for p in model.parameters())
    with report.collect() as reps, warnings.catch_warnings():
        warnings.simplefilter("error")  # the common call must not warn
        compiled = compile_bpu(model.eval(), executor="sim", calibrate="first-call")
        out = compiled(x)
        out2 = compiled(x)
    assert len(reps) == 1 and reps[0].grad_mode == "eval-inference"
    (rt,) = reps[0].runtimes
    assert rt.kind == "sim" and rt.builds == 1
    assert not out.requires_grad  # as under torch.no_grad()
    assert torch.equal(out, out2) and cosine(out, model(x)) > 0.99
    assert torch.is_grad_enabled()  # the caller's grad mode is untouched


def test_training_mode_warns_once_explain_truthful_strict_raises():
    model = seeded(ConvStack(4)).train()
    x = torch.randn(1, 3, 8, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = compile_bpu(model, executor="sim")
        compiled(x)
        compiled(x + 1)
    grad_warnings = [w for w in caught if "nothing offloaded" in str(w.message)]
    assert len(grad_warnings) == 1
    text = str(grad_warnings[0].message)
    assert "training mode" in text and "torch.no_grad()" in text

    torch._dynamo.reset()
    rep = bpu.explain(model, x, executor="sim")
    assert rep.coverage_pct == 0.0 and rep.partitions == [] and rep.compute_total > 0
    assert rep.graphs[0].grad_mode == "host-training"
    assert "ran on the host as training graphs" in rep.table()
    assert all("training mode" in n["reason"] for n in rep.cpu_nodes)
    assert rep.to_dict()["graphs"][0]["grad_mode"] == "host-training"

    torch._dynamo.reset()
    with pytest.raises(Exception, match="strict: nothing offloaded.*training mode"):
        compile_bpu(model, executor="sim", strict=True)(x)

    torch._dynamo.reset()
    with torch.no_grad():
        rep = bpu.explain(model.eval(), x, executor="sim")
    assert rep.coverage_pct == 100.0 and rep.graphs[0].grad_mode == "inference"


def test_input_requiring_grad_keeps_exact_host_gradients():
    model = seeded(ConvStack(4))
    x = torch.randn(1, 3, 8, 8, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught, report.collect() as reps:
        warnings.simplefilter("always")
        compile_bpu(model, executor="sim")(x).sum().backward()
    assert any("requires grad" in str(w.message) for w in caught)
    assert reps[0].grad_mode == "host-training" and not reps[0].partitions
    ref = x.detach().clone().requires_grad_()
    model(ref).sum().backward()
    assert torch.allclose(x.grad, ref.grad, atol=1e-6)

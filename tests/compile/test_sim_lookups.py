"""The sim executor's table lookups end to end (conversion/lookups.py): a compiled model gives
the same outputs, bit for bit, with its elementwise chains as lookups as without; explain()
counts them; where ONNX Runtime cannot load the lookup ops, the chains stay its float ops with
one warning and the same numbers."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

import torch_fl.bpu as bpu
from tests.compile.bpu_helpers import compile_bpu, runtimes
from tests.support.zoo import build
from torch_fl.bpu import report
from torch_fl.bpu.runtime import executors


class Activations(nn.Module):
    """Convs joined by the activations the pass turns into tables: hardswish, SiLU, tanh, GELU,
    and a squeeze-excitation gate (a per-channel scale of two 8-bit inputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 16, 3, padding=1)
        self.b = nn.Conv2d(16, 16, 3, padding=1)
        self.c = nn.Conv2d(16, 16, 1)
        self.squeeze = nn.Conv2d(16, 16, 1)
        self.d = nn.Conv2d(16, 8, 1)

    def forward(self, x):
        x = nn.functional.hardswish(self.a(x))
        x = nn.functional.silu(self.b(x))
        x = torch.tanh(self.c(x))
        gate = torch.sigmoid(self.squeeze(x.mean((2, 3), keepdim=True)))
        return nn.functional.gelu(self.d(x * gate))


def _run(model, x, samples, **options):
    torch._dynamo.reset()
    compiled = compile_bpu(model, executor="sim", cache=False, **options)
    with report.collect() as reports, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bpu.calibrate(compiled, samples)
        with torch.no_grad():
            out = compiled(x)
    sims = [r for r in runtimes(reports) if r.kind == "sim"]
    return out, sims, reports, caught


def _model(name: str):
    if name == "activations":
        torch.manual_seed(0)
        return Activations().eval(), torch.randn(2, 3, 12, 12)
    return build(name)


@pytest.mark.parametrize("name", ["activations", "mobilenetv3_small", "vit"])
def test_lookups_give_the_same_outputs_as_the_float_ops(name):
    model, x = _model(name)
    generator = torch.Generator().manual_seed(3)
    samples = [torch.randn(x.shape, generator=generator) for _ in range(2)]
    plain, plain_sims, _, _ = _run(model, x, samples, sim_lookups=False)
    looked, sims, reports, _ = _run(model, x, samples)
    if sims[0]._exec.kernels.path == "float":
        pytest.skip("no fused kernel path on this CPU: the float path has no lookups")
    assert [r._exec.lookups for r in plain_sims] == [0] * len(plain_sims)
    assert sum(r._exec.lookups for r in sims) > 0
    assert torch.equal(looked, plain)
    rep = report.Report(list(reports))
    counts = [p.sim_kernels["lookups"] for p in rep.partitions if p.sim_kernels]
    assert counts == [r._exec.lookups for r in sims]
    graph = rep.graphs[0]
    line = f"sim lookups: graph {graph.graph_id} part {graph.partitions[0].id}: {counts[0]} "
    from torch_fl import _C

    form = _C._lookup_kernel()
    assert line + f"elementwise chains as 8-bit table lookups ({form})" in rep.table()


def test_lookups_that_onnx_runtime_cannot_load_leave_its_float_ops(monkeypatch):
    model, x = _model("activations")
    samples = [torch.randn(x.shape) for _ in range(2)]
    plain, *_ = _run(model, x, samples, sim_lookups=False)
    monkeypatch.setattr(executors, "lookup_library", lambda: "/nonexistent/liblookups.so")
    out, sims, _, caught = _run(model, x, samples)
    if sims[0]._exec.kernels.path == "float":
        pytest.skip("no fused kernel path on this CPU: the float path has no lookups")
    assert [r._exec.lookups for r in sims] == [0] * len(sims)
    assert sims[0]._exec.kernels.path != "float"  # still the fused integer kernels
    messages = [str(w.message) for w in caught]
    assert any(
        "lookup / depthwise / grouped / narrow / pool / concat ops could not run this partition"
        in m
        for m in messages
    ), messages
    assert torch.equal(out, plain)


def test_lookups_go_into_ort_optimized_graph_with_no_transposes_of_their_own(tmp_path):
    import onnx
    import onnxruntime as ort

    from torch_fl.bpu.conversion.integer_form import to_integer_form
    from torch_fl.bpu.conversion.session_graph import session_graph

    model, x = _model("activations")
    _, sims, _, _ = _run(model, x, [torch.randn(x.shape) for _ in range(2)])
    path = sims[0]._exec.kernels.path
    if path == "float":
        pytest.skip("no fused kernel path on this CPU: the float path has no lookups")
    reference = onnx.load_from_string(sims[0].last_build.onnx_bytes)
    graph = to_integer_form(reference, path)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "plain.onnx")
    ort.InferenceSession(
        graph.SerializeToString(), options, disabled_optimizers=list(executors.UNFUSED)
    )
    plain = onnx.load(str(tmp_path / "plain.onnx"))
    rewritten = session_graph(graph, executors.UNFUSED, lookups=True, depthwise=False)
    count = rewritten.lookups
    looked_up = onnx.load_from_string(rewritten.data)

    def ops(m, op):
        return sum(n.op_type == op for n in m.graph.node)

    assert count == sims[0]._exec.lookups > 0
    assert ops(looked_up, "Transpose") == ops(plain, "Transpose")
    assert ops(looked_up, "QLinearConv") == ops(plain, "QLinearConv") > 0


def test_a_graph_with_no_chain_gets_no_optimization_pass(monkeypatch):
    import onnxruntime as ort

    from torch_fl.bpu.conversion.integer_form import to_integer_form
    from torch_fl.bpu.conversion.lookups import has_chains
    from torch_fl.bpu.conversion.session_graph import SessionGraph, session_graph

    torch.manual_seed(0)
    model = nn.Sequential(  # convs and a batch norm: no activation at all
        nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.Conv2d(16, 16, 1)
    ).eval()
    x = torch.randn(1, 16, 10, 10)
    _, sims, _, _ = _run(model, x, [torch.randn(x.shape) for _ in range(2)])
    path = sims[0]._exec.kernels.path
    if path == "float":
        pytest.skip("no fused kernel path on this CPU: the float path has no lookups")
    graph = to_integer_form(_reference(sims[0]), path)
    assert not has_chains(graph) and sims[0]._exec.lookups == 0

    def no_session(*args, **kwargs):
        raise AssertionError("an ORT session was opened for a graph with no chain")

    monkeypatch.setattr(ort, "InferenceSession", no_session)
    assert session_graph(graph, executors.UNFUSED, True, False) == SessionGraph(None, 0, 0)
    # nor for one whose grouped convs are all of aligned widths (this one has none at all)
    assert session_graph(graph, executors.UNFUSED, True, True) == SessionGraph(None, 0, 0)


def test_relus_moved_after_their_quantize_are_lookups():
    """ResNet-18's Relus: the integer form makes each a Max of the quantized values and the
    zero point, which the session graph holds as byte lookups (conversion/lookups.byte_clamp)."""
    from torch_fl.bpu.conversion.integer_form import to_integer_form
    from torch_fl.bpu.conversion.lookups import has_chains

    model, x = build("resnet18")
    ref = model(x)
    samples = [torch.randn(x.shape) for _ in range(2)]
    out, sims, _, _ = _run(model, x, samples)
    if sims[0]._exec.kernels.path != "u8s8":
        # `mixed` (a CPU without VNNI) quantizes a Relu'd tensor with zero point 0, where the
        # quantization's own clamp is the Relu: no Max is left to look up
        pytest.skip(f"the Relus become Max on the u8s8 path, not {sims[0]._exec.kernels.path}")
    graph = to_integer_form(_reference(sims[0]), sims[0]._exec.kernels.path)
    clamps = sum(n.op_type == "Max" for n in graph.graph.node)
    assert clamps > 0 and has_chains(graph)
    assert sims[0]._exec.lookups == clamps
    plain, plain_sims, _, _ = _run(model, x, samples, sim_lookups=False)
    assert plain_sims[0]._exec.lookups == 0
    assert torch.equal(out, plain) and out.shape == ref.shape


def _reference(runtime):
    import onnx

    return onnx.load_from_string(runtime.last_build.onnx_bytes)

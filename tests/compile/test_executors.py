import warnings

import pytest
import torch
from torch import nn

import torch_fl.bpu as bpu
from tests.compile.bpu_helpers import compile_bpu, cosine
from tests.support.models import ConvStack, DepthwiseSeparable, ResNet18, seeded
from torch_fl.bpu import report
from torch_fl.bpu.runtime import registry


@pytest.mark.board
def test_auto_without_board_is_eager_bit_exact_with_one_warning(monkeypatch):
    monkeypatch.setattr(registry, "_warned_no_board", False)
    model = seeded(DepthwiseSeparable())
    x = torch.randn(1, 8, 16, 16)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        out = compile_bpu(model)(x)
        torch._dynamo.reset()
        compile_bpu(seeded(ConvStack()))(torch.randn(1, 3, 8, 8))
    assert torch.equal(out, model(x))
    assert len([w for w in caught if "no BPU runtime" in str(w.message)]) == 1


def test_sim_resnet18_calibrated_cosine():
    model = seeded(ResNet18())
    samples = [torch.randn(1, 3, 64, 64) for _ in range(3)]
    compiled = compile_bpu(model, executor="sim", calibrate="none")
    with torch.no_grad():
        default = compiled(samples[0])
        cal = bpu.calibrate(compiled, samples)
        calibrated = compiled(samples[0])
        ref = model(samples[0])
    assert len(cal) == 1
    assert cosine(calibrated, ref) >= 0.99
    assert cosine(calibrated, ref) > cosine(default, ref)


class TwoParts(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3, padding=1)
        self.b = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.a(x))
        y = torch.cumsum(y, 1) * 0.1  # unsupported: splits the model in two partitions
        return torch.relu(self.b(y))


def test_calibration_reaches_every_partition_and_round_trips(tmp_path):
    model = TwoParts().eval()
    x = torch.randn(1, 3, 8, 8) * 0.01  # activations far below the default scale
    compiled = compile_bpu(model, executor="sim")
    with report.collect() as reps, torch.no_grad():
        compiled(x)
        cal = bpu.calibrate(compiled, [x], method="percentile", percentile=99.9)
        out = compiled(x)
    parts = reps[0].runtimes
    assert len(parts) == 2 and len(cal) == 2
    for rt in parts:
        assert rt.scales and all(s != 0.05 for s in rt.scales.values())
        assert rt.builds == 2  # rebuilt with the calibrated scales
    assert cosine(out, model(x)) >= 0.99
    path = tmp_path / "cal.json"
    cal.save(path)
    torch._dynamo.reset()
    with report.collect() as reps2, torch.no_grad():
        out2 = compile_bpu(model, executor="sim", calibration=str(path))(x)
    assert torch.equal(out2, out)
    assert [rt.scales for rt in reps2[0].runtimes] == [rt.scales for rt in parts]


def test_first_call_calibration():
    model = TwoParts().eval()
    x = torch.randn(1, 3, 8, 8) * 0.01
    with report.collect() as reps, torch.no_grad():
        out = compile_bpu(model, executor="sim", calibrate="first-call")(x)
    assert all(rt.scales for rt in reps[0].runtimes)
    assert cosine(out, model(x)) >= 0.99


@pytest.mark.parametrize("how", ["load_state_dict", "optimizer"])
def test_changed_weights_run_live_without_rebuild(how):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    compiled = compile_bpu(model, executor="sim", quantize=False, sim_weights="live")
    with report.collect() as reps, torch.no_grad():
        before = compiled(x)
    if how == "load_state_dict":
        state = {k: v * -1 for k, v in model.state_dict().items()}
        model.load_state_dict(state)
    else:
        with torch.no_grad():
            model[0].weight.mul_(-1)
            model[0].bias.mul_(-1)
    with torch.no_grad():
        after = compiled(x)
    assert reps[0].runtimes[0].builds == 1  # the sim graph reads the weights as inputs
    assert torch.allclose(after, model(x), atol=1e-5) and not torch.allclose(after, before)


def test_strict_mode():
    with pytest.raises(Exception, match="strict: nodes not offloaded.*cumsum"):
        with torch.no_grad():
            compile_bpu(TwoParts().eval(), executor="sim", strict=True)(torch.randn(1, 3, 8, 8))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="strict: partitions would run eagerly"):
        with torch.no_grad():
            compile_bpu(seeded(ConvStack()), strict=True)(torch.randn(1, 3, 8, 8))
    torch._dynamo.reset()
    model = seeded(ConvStack())
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        out = compile_bpu(model, executor="sim", strict=True)(x)
    assert cosine(out, model(x)) > 0.95


def test_training_never_reaches_bpu_pipeline():
    model = seeded(ConvStack(4)).train()
    ref = seeded(ConvStack(4)).train()
    x = torch.randn(2, 3, 8, 8)
    with report.collect() as reps:
        compile_bpu(model, executor="sim")(x).sum().backward()
    ref(x).sum().backward()
    # neither forward nor backward of training went to the BPU path (reported as host-run)
    assert reps and all(g.grad_mode == "host-training" and not g.partitions for g in reps)
    for p, q in zip(model.parameters(), ref.parameters(), strict=False):
        assert torch.allclose(p.grad, q.grad, atol=1e-5)


def test_profiler_ranges_and_report():
    model = TwoParts().eval()
    x = torch.randn(1, 3, 8, 8)
    compiled = compile_bpu(model, executor="sim")
    with torch.no_grad():
        compiled(x)
        with torch.profiler.profile() as prof:
            compiled(x)
    names = {e.name for e in prof.events()}
    assert {"bpu::partition0[sim]", "bpu::partition1[sim]"} <= names
    torch._dynamo.reset()
    rep = bpu.explain(model, x, executor="sim")
    data = rep.to_dict()
    assert data["graphs"][0]["partitions"][0]["executor"] == "sim"
    assert 0 < rep.coverage_pct < 100 and "cumsum" in rep.table()
    assert rep.partitions[0].inputs == [[1, 3, 8, 8]]


def _spin_stop(rt) -> str | None:
    """The partition session's SPIN_STOP entry (None: not set, ORT's spin)."""
    from torch_fl.bpu.runtime.executors import SPIN_STOP

    try:
        return rt._exec.session.get_session_options().get_session_config_entry(SPIN_STOP)
    except RuntimeError:  # ORT: no such entry
        return None


@pytest.mark.parametrize("threads", [1, 2])
def test_sessions_of_a_graph_of_several_partitions_stop_spinning_after_each_run(threads):
    """Each sim partition's session has a pool of its own: in a graph of two, one pool's threads
    must not spin on while the other's run (runtime/executors.SPIN_STOP). A graph of one keeps
    ORT's spin, and a session of one thread has no pool."""
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8, 8)
    options = {"sim_threads": threads, "sim_thread_choice": "fixed"}
    got = {}
    for name, model in (("two", TwoParts().eval()), ("one", ConvStack().eval())):
        torch._dynamo.reset()
        with report.collect() as reps, torch.no_grad():
            out = compile_bpu(model, executor="sim", **options)(x)
        sims = [r for g in reps for r in g.runtimes if r.kind == "sim"]
        assert cosine(out, model(x)) >= 0.99
        assert all(r._exec.threads == threads for r in sims)
        got[name] = (
            len(sims),
            [r._exec.stop_spinning for r in sims],
            [_spin_stop(r) for r in sims],
        )
    assert got["two"][:2] == (2, [True, True])
    assert got["one"][:2] == (1, [False])
    assert got["two"][2] == (["1", "1"] if threads > 1 else [None, None])
    assert got["one"][2] == [None]

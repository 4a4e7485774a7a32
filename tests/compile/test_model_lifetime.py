"""A compiled model keeps its promises after its first call: recompiles, new shapes, a new
process, flagos tensors, torch.compile's own conventions (docs/compile.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import torch_fl.bpu as bpu
from tests.compile.bpu_helpers import cosine
from torch_fl.bpu import report
from torch_fl.bpu.conversion.calibration_store import STORE

ROOT = Path(__file__).resolve().parents[2]


class Sensitive(nn.Module):
    """Activations far beyond the default scale's +-6.35: uncalibrated int8 collapses."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3)
        self.bn = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 8, 3)

    def forward(self, x):
        return torch.flatten(self.conv2(self.bn(torch.relu(self.conv1(x)))), 1)


def _model() -> Sensitive:
    torch.manual_seed(0)
    model = Sensitive().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    return model


def _samples(n: int, batch: int = 1, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, 3, 16, 16, generator=g) * 40 for _ in range(n)]


def _states(reps) -> list[dict]:
    return [p.calibration for g in reps for p in g.partitions]


def test_default_scale_never_runs_silently():
    model = _model()
    x = _samples(1)[0]
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        compiled = torch.compile(model, backend="bpu", options={"executor": "sim"})
        out = compiled(x)
    assert any("had no calibration" in str(w.message) for w in caught)
    assert cosine(out, model(x)) > 0.999  # calibrated on the call itself, not act_scale=0.05
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        none = torch.compile(
            model, backend="bpu", options={"executor": "sim", "calibrate": "none", "cache": False}
        )
        STORE.clear_memory()
        low = none(x)
    assert any("default activation scale" in str(w.message) for w in caught)
    assert cosine(low, model(x)) < 0.99  # what the warning is about
    torch._dynamo.reset()
    STORE.clear_memory()
    strict = torch.compile(
        model, backend="bpu", options={"executor": "sim", "calibrate": "require", "cache": False}
    )
    with pytest.raises(bpu.BpuError, match="has no calibration.*calibrate\\(compiled"):
        strict(x)


def test_calibration_survives_reset_grad_mode_and_batch_change():
    model = _model()
    compiled = torch.compile(model, backend="bpu", options={"executor": "sim"})
    bpu.calibrate(compiled, _samples(6))
    test = _samples(1, seed=7)[0]
    with torch.no_grad():
        ref = model(test)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing uncalibrated, nothing silently on the CPU
        with report.collect() as reps:
            grad_on = compiled(test)  # grad enabled: another Dynamo graph than calibrate's
            torch._dynamo.reset()
            after_reset = compiled(test)
            batch4 = torch.cat(_samples(4, seed=9))
            with torch.no_grad():
                out4 = compiled(batch4)
                ref4 = model(batch4)
    assert cosine(grad_on, ref) > 0.999 and cosine(after_reset, ref) > 0.999
    assert cosine(out4, ref4) > 0.999
    states = _states(reps)
    assert states and all(s["state"] == "calibrated" for s in states), states
    assert any("carried over from another input shape" in s["source"] for s in states)
    assert all(p.executor == "sim" for g in reps for p in g.partitions)
    assert [p.inputs for g in reps for p in g.partitions][-1] == [[4, 3, 16, 16]]


def test_calibration_found_by_a_new_process(cache_dir):
    model = _model()
    torch.save(model.state_dict(), cache_dir.parent / "weights.pt")
    compiled = torch.compile(model, backend="bpu", options={"executor": "sim"})
    bpu.calibrate(compiled, _samples(5))
    records = list((cache_dir / "calibration").glob("*.json"))
    assert len(records) == 3  # the exact key, the shape-free key, the key of these samples
    script = textwrap.dedent(
        f"""
        import json, sys, warnings
        sys.path.insert(0, {str(ROOT)!r})
        import torch, torch_fl.bpu as bpu
        from tests.compile.test_model_lifetime import Sensitive
        model = Sensitive().eval()
        model.load_state_dict(torch.load({str(cache_dir.parent / "weights.pt")!r}))
        compiled = torch.compile(model, backend="bpu", options={{"executor": "sim"}})
        warnings.simplefilter("error")
        with torch.no_grad():
            rep = bpu.explain(compiled, torch.randn(1, 3, 16, 16) * 40)
        print(json.dumps(rep.partitions[0].calibration))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    state = json.loads(done.stdout.strip().splitlines()[-1])
    assert state["state"] == "calibrated" and "cache store" in state["source"], state


def test_corrupt_calibration_record_is_a_warned_miss(cache_dir):
    model = _model()
    compiled = torch.compile(model, backend="bpu", options={"executor": "sim"})
    bpu.calibrate(compiled, _samples(3))
    for record in (cache_dir / "calibration").glob("*.json"):
        record.write_text('{"format": 1, "scales": {"x": -1}')
    STORE.clear_memory()
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        out = compiled(_samples(1)[0])
    messages = [str(w.message) for w in caught]
    assert any("calibration record" in m and "unreadable" in m for m in messages), messages
    assert any("had no calibration" in m for m in messages)
    assert out.shape == (1, 1152)


def test_other_weights_never_get_these_scales():
    model = _model()
    compiled = torch.compile(model, backend="bpu", options={"executor": "sim"})
    bpu.calibrate(compiled, _samples(3))
    other = _model()
    with torch.no_grad():
        other.conv1.weight.mul_(3)
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        torch.compile(other, backend="bpu", options={"executor": "sim"})(_samples(1)[0])
    assert any("had no calibration" in str(w.message) for w in caught)


def test_shape_limit_runs_on_host_with_one_warning():
    model = _model()
    compiled = torch.compile(
        model,
        backend="bpu",
        options={"executor": "sim", "max_shapes": 2, "calibrate": "first-call"},
    )
    outs = []
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for batch in (1, 2, 3, 5, 6):
            x = _samples(1, batch)[0]
            outs.append((compiled(x), model(x)))
    limit = [w for w in caught if "max_shapes" in str(w.message)]
    assert len(limit) == 1 and "run on the host" in str(limit[0].message)
    for got, ref in outs:
        assert cosine(got, ref) > 0.999
    assert torch.equal(*outs[-1])  # beyond the limit: the host graph, exact


def test_mark_dynamic_and_dynamic_true_keep_the_bpu_path():
    model = _model()
    for how in ("dynamic", "mark"):
        torch._dynamo.reset()
        x = _samples(1, 3)[0]
        if how == "mark":
            torch._dynamo.mark_dynamic(x, 0)
        compiled = torch.compile(
            model,
            backend="bpu",
            dynamic=True if how == "dynamic" else None,
            options={"executor": "sim", "calibrate": "first-call"},
        )
        with report.collect() as reps, torch.no_grad():
            compiled(x)
        rep = report.Report(list(reps))
        assert rep.coverage_pct == 100.0 and rep.offloaded_pct == 100.0, rep.table()


def test_flagos_model_runs_under_sim_outputs_on_flagos():
    model = _model().to("flagos")
    x = _samples(1)[0].to("flagos")
    compiled = torch.compile(
        model, backend="bpu", options={"executor": "sim", "calibrate": "first-call"}
    )
    with torch.no_grad(), report.collect() as reps:
        out = compiled(x)
        again = compiled(x)
        ref = model(x)
    assert out.device.type == "flagos" and again.device.type == "flagos"
    assert cosine(out.cpu(), ref.cpu()) > 0.999 and torch.equal(out.cpu(), again.cpu())
    assert reps[0].partitions[0].executor == "sim"
    with torch.no_grad():
        model.conv1.weight.add_(1.0)  # a baked flagos weight changed in place: rebuilt
        changed = compiled(x)
        ref2 = model(x)
    assert cosine(changed.cpu(), ref2.cpu()) > 0.999
    assert reps[0].runtimes[0].builds == 2


def test_torch_compile_conventions():
    model = _model()
    x = _samples(1)[0]
    with torch.no_grad():
        out = torch.compile(model, backend="bpu", mode="max-autotune")(x)
    assert torch.equal(out, model(x))  # mode changes nothing (auto executor: eager here)
    torch._dynamo.reset()
    with pytest.raises(bpu.SettingsError, match="did you mean 'executor'"):
        torch.compile(model, backend="bpu", options={"exectuor": "sim"})(x)
    torch._dynamo.reset()
    with pytest.raises(bpu.BpuError, match="did you mean 'sim'"):
        torch.compile(model, backend="bpu", options={"executor": "simm"})(x)


def test_explain_describes_the_compiled_model():
    model = _model()
    compiled = torch.compile(model, backend="bpu", options={"executor": "sim"})
    bpu.calibrate(compiled, _samples(2))
    with torch.no_grad():
        compiled(_samples(1)[0])
        compiled(_samples(1, 4)[0])  # Dynamo now hands the backend symbolic shapes
        rep = bpu.explain(compiled, _samples(1, 4)[0])
    assert rep.coverage_pct == 100.0 and rep.offloaded_pct == 100.0, rep.table()
    assert [p.inputs for p in rep.partitions] == [[[4, 3, 16, 16]]]
    assert "calibration:" in rep.table() and "calibrated" in rep.table()
    with pytest.raises(bpu.BpuError, match="options apply only"):
        bpu.explain(compiled, _samples(1)[0], executor="eager")
    with pytest.raises(bpu.BpuError, match=r"no inputs failed .*pass its inputs"):
        bpu.explain(compiled)  # explain runs the model: the inputs are not optional

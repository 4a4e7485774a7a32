"""Calibration methods (conversion/thresholds.py) and calibrate()'s inputs and replay.

- each method's threshold on known distributions: what it promises (mse: the least squared
  error on its grid; auto: the least error of the candidates; kl: ignores Relu's zeros);
- the reservoir keeps bounded memory and the exact maximum;
- calibrate() takes lists, generators, DataLoader-style (inputs, labels) batches and dicts;
- the same list of samples calibrated again is replayed from the store after one sample.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import torch_fl.bpu as bpu
from tests.compile.bpu_helpers import compile_bpu, cosine
from torch_fl.bpu.conversion import thresholds as th


def _reservoir(values: np.ndarray) -> th.Reservoir:
    r = th.Reservoir()
    for chunk in np.array_split(values, 7):
        r.add(chunk)
    return r


@pytest.mark.parametrize("dist", ["relu_gauss", "gauss", "laplace"])
def test_method_thresholds_keep_their_promises(dist: str) -> None:
    rng = np.random.default_rng(0)
    x = {
        "relu_gauss": np.maximum(rng.standard_normal(400_000), 0),
        "gauss": rng.standard_normal(400_000),
        "laplace": rng.laplace(size=400_000),
    }[dist].astype(np.float32)
    r = _reservoir(x)
    assert r.maximum == pytest.approx(float(np.abs(x).max()))  # exact, not sampled
    assert r.values.size <= r.capacity
    got = {m: th.threshold(r, m)[0] for m in ("max", "percentile", "kl", "mse")}
    err = {m: th.quant_mse(r.values, t) for m, t in got.items()}
    assert got["max"] == r.maximum and got["percentile"] < got["max"]
    assert err["mse"] <= min(err["max"], err["kl"]) * 1.0001
    assert 0.5 * got["max"] < got["kl"] <= got["max"]  # Relu's zeros do not drag it down
    t, pick = th.threshold(r, "auto")
    assert pick in got and th.quant_mse(r.values, t) == pytest.approx(min(err.values()))


def test_threshold_edge_cases() -> None:
    empty = th.Reservoir()
    assert th.threshold(empty, "kl") == (0.0, "max")
    zeros = th.Reservoir()
    zeros.add(np.zeros(100, np.float32))
    assert th.threshold(zeros, "auto")[0] == 0.0
    inf = th.Reservoir()
    inf.add(np.array([1.0, np.inf, np.nan, -2.0], np.float32))
    assert inf.maximum == 2.0  # non-finite values are not observed
    with pytest.raises(ValueError, match="one of"):
        th.threshold(inf, "median")


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3))

    def forward(self, x):
        return self.body(x)


@pytest.mark.parametrize("method", th.METHODS)
def test_every_method_calibrates_a_model(method: str) -> None:
    torch.manual_seed(0)
    model = _Net().eval()
    samples = [torch.randn(1, 3, 16, 16) for _ in range(3)]
    compiled = compile_bpu(model, executor="sim", cache=False)
    cal = bpu.calibrate(compiled, samples, method=method)
    assert cal.method == method and all(v > 0 for s in cal.scales.values() for v in s.values())
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        assert cosine(compiled(x), model(x)) > 0.99


def test_samples_of_every_kind() -> None:
    torch.manual_seed(0)
    model = _Net().eval()
    data = [torch.randn(1, 3, 16, 16) for _ in range(3)]
    compiled = compile_bpu(model, executor="sim", cache=False)
    want = bpu.calibrate(compiled, data).scales
    labelled = [(x, torch.tensor([1])) for x in data]  # a DataLoader's (inputs, labels)
    assert bpu.calibrate(compiled, iter(labelled)).scales == want  # generator, labels dropped
    assert bpu.calibrate(compiled, [{"x": x} for x in data]).scales == want  # keyword inputs
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.cat(data)))
    assert bpu.calibrate(compiled, loader).scales == want  # [inputs] lists of batch 1


def test_the_same_samples_again_are_replayed_from_the_store(monkeypatch) -> None:
    torch.manual_seed(0)
    model = _Net().eval()
    samples = [torch.randn(1, 3, 16, 16) for _ in range(12)]
    compiled = compile_bpu(model, executor="sim")
    first = bpu.calibrate(compiled, samples, method="mse")
    calls = []
    original = bpu.calibrate.__globals__["_call"]

    def counting(*args):
        calls.append(1)
        return original(*args)

    monkeypatch.setitem(bpu.calibrate.__globals__, "_call", counting)
    again = bpu.calibrate(compiled, samples, method="mse")
    assert again.scales == first.scales and len(calls) == 1  # one sample, then the store
    other = bpu.calibrate(compiled, samples[:6], method="mse")  # other samples: measured again
    assert len(calls) == 1 + 6 and other.scales != first.scales
    bpu.calibrate(compiled, samples, method="max")  # other settings: measured again
    assert len(calls) == 1 + 6 + 12
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        start = time.perf_counter()
        bpu.calibrate(compiled, samples, method="mse")
    assert len(calls) == 1 + 6 + 12 + 1 and time.perf_counter() - start < 30


def test_calibrate_runs_each_sample_once_and_hands_on_the_float_outputs(monkeypatch) -> None:
    """The observer's float run computes the partition's outputs: calibrate() hands them to what
    follows (here a host op, then a second partition) instead of running the partition again."""
    import importlib

    from torch_fl.bpu import report

    calibrate_module = importlib.import_module("torch_fl.bpu.calibrate")  # the module, not the API

    class TwoParts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3)

        def forward(self, x):
            return self.b(torch.cumsum(torch.relu(self.a(x)), dim=1) / 8)

    torch.manual_seed(0)
    model = TwoParts().eval()
    compiled = compile_bpu(model, executor="sim")
    samples = [torch.randn(2, 3, 12, 12) for _ in range(3)]
    with report.collect() as reps, torch.no_grad():
        compiled(samples[0])
    runtimes = reps[0].runtimes
    assert len(runtimes) == 2
    eager_calls: list[int] = []

    def counted(inner):
        def forward(*args):
            if not torch.jit.is_tracing():  # tracing: the observer graph's ONNX export, not a run
                eager_calls.append(1)
            return inner(*args)

        return forward

    for rt in runtimes:
        rt.eager.forward = counted(rt.eager.forward)
    observed: dict[int, list] = {id(rt): [] for rt in runtimes}
    real_observe = calibrate_module._Session.observe

    def spy(self, part, args):
        observed[id(part)].append([args[i].detach().clone() for i in part.spec.runtime_positions])
        return real_observe(self, part, args)

    monkeypatch.setattr(calibrate_module._Session, "observe", spy)
    bpu.calibrate(compiled, samples)
    assert eager_calls == []  # no partition ran eagerly beside its observer
    assert all(len(v) == len(samples) for v in observed.values())  # these very partitions ran
    # the second partition (the division and conv b) read the host op's cumsum of the first
    # one's float output
    second = next(rt for rt in runtimes if rt.spec.index == 1)
    for (got,), x in zip(observed[id(second)], samples, strict=True):
        want = torch.cumsum(torch.relu(model.a(x)), dim=1).detach()
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        assert cosine(compiled(samples[0]), model(samples[0])) > 0.999

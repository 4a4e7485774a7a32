"""calibrate() through a recompile: a model whose first call changes its own state (a cache that
Dynamo guards on, as LeViT's attention-bias cache) gets a second graph during calibration, and
that graph's partitions are calibrated on every sample all the same (calibrate.py
`_run_missed`)."""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch
from torch import nn

import torch_fl.bpu as bpu
from torch_fl.bpu import report


class FillsItsCache(nn.Module):
    """Its first call stores a tensor in a dict that later calls read: Dynamo's guard on the
    dict fails on the second call, and the model recompiles."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3)
        self.conv2 = nn.Conv2d(8, 4, 3)
        self.cache: dict[str, torch.Tensor] = {}

    def forward(self, x):
        if "gain" not in self.cache:
            self.cache["gain"] = torch.full((1, 8, 1, 1), 1.5)
        return torch.flatten(self.conv2(torch.relu(self.conv1(x)) * self.cache["gain"]), 1)


def _model() -> FillsItsCache:
    torch.manual_seed(0)
    return FillsItsCache().eval()


def _samples(n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    # sample 0 has the widest range: a partition that missed it gets other scales
    return [torch.randn(1, 3, 12, 12, generator=g) * (8.0 if i == 0 else 1.0) for i in range(n)]


def _compiled(model: nn.Module):
    return torch.compile(model, backend="bpu", options={"executor": "sim", "cache": False})


def _live_scales(calibration, reps) -> tuple[dict, str]:
    """The scales and calibration source of the partition the model runs now (its last graph)."""
    part = reps[-1].partitions[0]
    return calibration.scales[part.fingerprint], part.calibration["source"]


def test_the_graph_a_recompile_made_is_calibrated_on_every_sample():
    samples = _samples(3)
    # the reference: the same model called once first, so calibration sees one graph throughout
    reference = _model()
    compiled_ref = _compiled(reference)
    with torch.no_grad():
        compiled_ref(samples[1])
    with report.collect() as reps_ref:
        want = bpu.calibrate(compiled_ref, samples)
        with torch.no_grad():
            want_out = compiled_ref(samples[2])
    torch._dynamo.reset()

    model = _model()
    compiled = _compiled(model)
    with report.collect() as reps:
        got = bpu.calibrate(compiled, samples)
        with torch.no_grad():
            out = compiled(samples[2])
    assert len(reps) == 2, "the model must recompile during calibration for this test"
    scales, source = _live_scales(got, reps)
    want_scales, _ = _live_scales(want, reps_ref)
    assert "on 3 sample(s)" in source, source
    assert scales == want_scales
    torch.testing.assert_close(out, want_out, rtol=0, atol=0)


def test_without_the_replay_the_late_graph_misses_the_first_sample(monkeypatch):
    """The check above can fail: with the replay off the live graph sees samples 1 and 2 only."""
    # the module (torch_fl.bpu.calibrate is also the function's name in the package)
    calibrate_module = importlib.import_module("torch_fl.bpu.calibrate")
    monkeypatch.setattr(calibrate_module, "REPLAY_ROUNDS", 0)
    samples = _samples(3)
    compiled = _compiled(_model())
    with report.collect() as reps:
        got = bpu.calibrate(compiled, samples)
    _, source = _live_scales(got, reps)
    assert "on 2 sample(s)" in source, source


def test_a_generator_of_samples_cannot_be_run_again_and_says_so():
    samples = _samples(3)
    compiled = _compiled(_model())
    with report.collect() as reps, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = bpu.calibrate(compiled, (s for s in samples))
    texts = [str(w.message) for w in caught if "recompiled during calibration" in str(w.message)]
    assert len(texts) == 1, [str(w.message) for w in caught]
    assert "partition 0 (from sample 2)" in texts[0] and "as a list" in texts[0]
    _, source = _live_scales(got, reps)
    assert "on 2 sample(s)" in source, source


@pytest.mark.parametrize("method", ["percentile", "mse"])
def test_histogram_methods_count_each_sample_once(method):
    """The replay records only the partitions that missed samples: the first graph's partition,
    which saw sample 0, is not fed it twice (its count stays 1)."""
    samples = _samples(3)
    compiled = _compiled(_model())
    with report.collect() as reps:
        bpu.calibrate(compiled, samples, method=method)
    first = reps[0].partitions[0].calibration["source"]
    assert "on 1 sample(s)" in first, first
    assert "on 3 sample(s)" in reps[-1].partitions[0].calibration["source"]

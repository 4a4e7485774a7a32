"""calibrate(bias_correction=...): each Conv / Gemm bias corrected by its output channels' mean
int8 error (conversion/bias_correction.py), kept in the store and in a saved Calibration."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import torch_fl.bpu as bpu
from tests.compile.bpu_helpers import compile_bpu, cosine
from torch_fl.bpu import report
from torch_fl.bpu.errors import SettingsError


class RoundsDown(nn.Module):
    """A conv whose int8 weights all round the same way: per output channel one weight sets the
    scale s (127 s), every other one is s (k + 0.45), so rounding takes 0.45 s from each; with
    inputs that are never negative the error of each output channel has a mean far from 0."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            s = 0.01 * (1 + torch.rand(6, 1, 1, 1, generator=gen))
            k = torch.randint(0, 4, (6, 4, 3, 3), generator=gen).float()
            w = s * (k + 0.45)
            w[:, 0, 0, 0] = 127 * s[:, 0, 0, 0]
            self.conv.weight.copy_(w)

    def forward(self, x):
        return self.conv(x)


def _samples(n: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.rand(1, 4, 12, 12, generator=gen) for _ in range(n)]


def _calibrated(bias_correction, capsys=None):
    model = RoundsDown().eval()
    compiled = compile_bpu(model, executor="sim", cache=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = bpu.calibrate(compiled, _samples(8, 1), bias_correction=bias_correction)
    return model, compiled, cal


def _errors(model, compiled) -> tuple[float, float]:
    """(worst cosine, mean |error|) against float on held-out samples."""
    with torch.no_grad():
        pairs = [(compiled(x), model(x)) for x in _samples(4, 2)]
    return (
        min(cosine(a, b) for a, b in pairs),
        sum(float((a - b).abs().mean()) for a, b in pairs) / len(pairs),
    )


def test_bias_correction_brings_the_output_closer_and_is_kept(capsys, tmp_path) -> None:
    model, plain, _ = _calibrated(False)
    cos_plain, err_plain = _errors(model, plain)
    torch._dynamo.reset()
    model, compiled, cal = _calibrated(True)
    printed = capsys.readouterr().out
    cos_bc, err_bc = _errors(model, compiled)
    assert "bias correction in 1 of 1 layer(s)" in printed
    assert cos_bc > cos_plain and err_bc < 0.5 * err_plain, (cos_plain, cos_bc, err_plain, err_bc)
    ((fingerprint, deltas),) = cal.bias.items()
    ((name, delta),) = deltas.items()
    assert len(delta) == 6 and all(d > 0 for d in delta)  # rounding took from every channel
    # the same samples again: found in the store after one sample, nothing measured again
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = bpu.calibrate(compiled, _samples(8, 1), bias_correction=True)
    assert "bias correction" not in capsys.readouterr().out
    assert again.bias == cal.bias
    assert _errors(model, compiled) == pytest.approx((cos_bc, err_bc), rel=1e-6)
    # a saved file, in a fresh compile that never calibrated
    path = tmp_path / "cal.json"
    cal.save(path)
    assert type(cal).load(path).bias_for(fingerprint) == deltas
    torch._dynamo.reset()
    with report.collect() as reps:
        fresh = compile_bpu(model, executor="sim", cache=False, calibration=str(path))
        assert _errors(model, fresh) == pytest.approx((cos_bc, err_bc), rel=1e-6)
    assert reps[0].runtimes[0].bias == deltas
    # the live-weights graph adds the correction to the live bias
    torch._dynamo.reset()
    live = compile_bpu(
        model, executor="sim", cache=False, calibration=str(path), sim_weights="live"
    )
    assert _errors(model, live) == pytest.approx((cos_bc, err_bc), rel=1e-5)


def test_no_correction_where_int8_is_exact() -> None:
    """Weights on their int8 grid, a zero bias and inputs on theirs (k / 127, max 1): the int8
    layer equals the float one, no correction raises its cosine, none is kept."""
    model = RoundsDown().eval()
    with torch.no_grad():
        w = model.conv.weight
        s = w[:, :1, :1, :1] / 127
        w.copy_(torch.round(w / s) * s)
        model.conv.bias.zero_()
    compiled = compile_bpu(model, executor="sim", cache=False)
    gen = torch.Generator().manual_seed(3)
    samples = [torch.randint(0, 128, (1, 4, 12, 12), generator=gen) / 127.0 for _ in range(4)]
    for x in samples:
        x.view(-1)[0] = 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = bpu.calibrate(compiled, samples, bias_correction=True)
    assert cal.bias == {}


def test_the_option_turns_it_on_for_calibrate(capsys) -> None:
    compiled = compile_bpu(RoundsDown().eval(), executor="sim", cache=False, bias_correction=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = bpu.calibrate(compiled, _samples(4, 1))
        off = bpu.calibrate(compiled, _samples(4, 1), bias_correction=False)
    assert cal.bias and not off.bias
    assert "bias correction in 1 of 1" in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["sometimes", 2, [True]])
def test_bad_bias_correction_is_refused(bad) -> None:
    compiled = compile_bpu(RoundsDown().eval(), executor="sim", cache=False)
    with pytest.raises(SettingsError, match="bias_correction"):
        bpu.calibrate(compiled, _samples(1, 1), bias_correction=bad)


def test_the_correction_carries_over_to_another_batch_size() -> None:
    model, compiled, cal = _calibrated(True)
    ((deltas),) = cal.bias.values()
    x = torch.cat(_samples(2, 2))
    with report.ran() as reps, torch.no_grad():
        out = compiled(x)  # batch 2: a new graph, the scales carried over by position
    (part,) = [r for g in reps for r in g.runtimes if r.spec.fingerprint not in cal.bias]
    assert "carried over" in part.entry.calibration["source"]
    assert part.bias == deltas
    with torch.no_grad():
        one = torch.cat([compiled(x[i : i + 1]) for i in range(2)])
    assert torch.allclose(out, one, atol=1e-5)

"""Calibration measures int8 against float per partition, reports it and warns on a collapse."""

import json
import warnings

import pytest
import torch
from torch import nn

import torch_fl.bpu as bpu
from tests.compile.bpu_helpers import compile_bpu
from tests.support.models import ConvStack, seeded
from torch_fl.bpu import report


class OutlierChannel(nn.Module):
    """Channel 0 of the input is huge and ignored; the answer lives in the small channels."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        with torch.no_grad():
            self.conv.weight[:, 0] = 0.0
            self.conv.bias.zero_()

    def forward(self, x):
        return torch.relu(self.conv(x))


def _samples(n, outlier: bool):
    generator = torch.Generator().manual_seed(5)
    out = []
    for _ in range(n):
        x = torch.randn(1, 4, 8, 8, generator=generator) * 0.01
        if outlier:
            x[:, 0] = 1e4
        out.append(x)
    return out


def test_collapse_is_measured_reported_and_warned():
    model = OutlierChannel().eval()
    with report.collect() as reps:
        compiled = compile_bpu(model, executor="sim")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            bpu.calibrate(compiled, _samples(3, outlier=True))
    messages = [str(w.message) for w in caught if "quantization health" in str(w.message)]
    assert len(messages) == 1
    assert "partition 0" in messages[0] and "rounded to zero" in messages[0]
    health = reps[0].partitions[0].quant_health
    assert health["cosine"] < 0.99 and health["samples"] == 3
    assert health["worst_tensor"]["zeroed_pct"] > 50.0  # the small channels vanish
    rep = report.Report(list(reps))
    assert "LOW" in rep.table()
    data = json.loads(rep.to_json())
    assert data["graphs"][0]["partitions"][0]["quant_health"]["cosine"] == health["cosine"]


def test_healthy_model_has_no_warning_and_first_call_records_health():
    model = seeded(ConvStack(8))
    samples = [torch.randn(1, 3, 16, 16) for _ in range(3)]
    with report.collect() as reps, warnings.catch_warnings():
        warnings.simplefilter("error")  # no health warning
        compiled = compile_bpu(model, executor="sim")
        bpu.calibrate(compiled, samples)
    health = reps[0].partitions[0].quant_health
    assert health["cosine"] >= 0.999 and health["saturated_pct"] == 0.0  # max calibration

    torch._dynamo.reset()
    with report.collect() as reps, torch.no_grad():
        with pytest.warns(UserWarning, match="quantization health"):
            compile_bpu(OutlierChannel().eval(), executor="sim", calibrate="first-call")(
                _samples(1, outlier=True)[0]
            )
    assert reps[0].partitions[0].quant_health["cosine"] < 0.99


class FadedFeatures(nn.Module):
    """Features that have faded to ~1e-9 before a conv with an ordinary bias (what random-weight
    MobileNetV3/DeepLabV3 heads look like): the output is essentially that bias."""

    def __init__(self) -> None:
        super().__init__()
        self.fade = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 5, 1)
        with torch.no_grad():
            self.fade.weight.mul_(1e-9)
            self.fade.bias.zero_()

    def forward(self, x):
        return self.head(torch.relu(self.fade(x)))


def test_tiny_activation_scale_keeps_the_bias_instead_of_wrapping_int32():
    torch.manual_seed(0)
    model = FadedFeatures().eval()
    x = torch.randn(1, 3, 8, 8)
    samples = [torch.randn(1, 3, 8, 8) for _ in range(3)]
    with torch.no_grad():
        ref = model(x)
    compiled = compile_bpu(model, executor="sim")
    with report.collect() as reps:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # healthy: no quantization warning
            bpu.calibrate(compiled, samples)
        with torch.no_grad():
            out = compiled(x)
    # before: bias / (act_scale * w_scale) left int32, wrapped, and the output collapsed
    assert torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0) > 0.999
    assert out.std() > 0.5 * ref.std()
    assert reps[0].partitions[0].quant_health["cosine"] >= 0.999


class DeadChannel(nn.Module):
    """A trained network's dead channel after BatchNorm folding: weights ~1e-8 beside an
    ordinary bias (EfficientNet-Lite0's stem has such channels), next to live channels."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 4, 1)
        with torch.no_grad():
            self.conv.weight[0].mul_(1e-8)
            self.conv.bias[0] = -3.0

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)))


@pytest.mark.parametrize("sim_weights", ["checked", "live"])
def test_a_dead_channel_raises_its_own_weight_scale_not_the_input_scale(sim_weights) -> None:
    """Before: the bias of the dead channel left int32 at max|w|/127, the pass raised the shared
    input scale to fit it and every channel's input collapsed to a few levels."""
    import onnx

    torch.manual_seed(0)
    model = DeadChannel().eval()
    samples = [torch.randn(1, 3, 8, 8) for _ in range(3)]
    compiled = compile_bpu(model, executor="sim", sim_weights=sim_weights)
    with report.collect() as reps:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # healthy: no quantization warning
            bpu.calibrate(compiled, samples)
        with torch.no_grad():
            out, ref = compiled(samples[0]), model(samples[0])
    assert torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0) > 0.999
    part = reps[0].runtimes[0]
    graph = onnx.load_from_string(part.last_build.onnx_bytes).graph
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    first_q = next(n for n in graph.node if n.op_type == "QuantizeLinear")
    assert first_q.input[0] == graph.input[0].name
    # the calibrated ~4 / 127, not raised to fit the dead channel's bias (~3e-3 x 127 / 1e-8 / 2^30)
    assert float(inits[first_q.input[1]]) < 0.1

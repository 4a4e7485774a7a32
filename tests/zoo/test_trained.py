"""Trained weights on real photos (tests/support/trained.py).

- plain `calibrate()` matches ONNX Runtime's static quantizer with the same (symmetric int8,
  MinMax) scheme on the same calibration and held-out crops, and `method="percentile"` beats it;
- `calibrate(target=0.999)` on every network of `trained.MODELS` (MobileNetV2, EfficientNet-Lite0,
  MTCNN's ONet) meets the target on every calibration sample, reaches >= 0.99 on held-out
  photos, says what it moved, and keeps it across a recompile.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_fl.bpu as bpu
from tests.support import trained
from tests.support.public_zoo import cosine, output_tensors

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(trained.available() is not None, reason=str(trained.available())),
]


@pytest.fixture(scope="module")
def setup():
    model = trained.mobilenet_v2_features()
    calib = trained.crops(trained.CALIB_PHOTOS, 4, seed=1)
    test = trained.crops(trained.TEST_PHOTOS, 4, seed=2)
    with torch.no_grad():
        refs = [model(x) for x in test]
    return model, calib, test, refs


def _mean(run, test, refs) -> float:
    with torch.no_grad():
        return sum(cosine(run(x), r) for x, r in zip(test, refs, strict=True)) / len(test)


def _compiled(model):
    torch._dynamo.reset()
    return torch.compile(model, backend="bpu", options={"executor": "sim", "cache": False})


def test_plain_calibration_matches_onnx_runtime_symmetric_int8(setup) -> None:
    model, calib, test, refs = setup
    compiled = _compiled(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bpu.calibrate(compiled, calib)
    ours = _mean(compiled, test, refs)
    peer = _mean(trained.ort_int8(model, calib, symmetric=True), test, refs)
    # The same scheme and method (symmetric int8, max ranges): within 0.005. Measured 0.9496 vs
    # ONNX Runtime's 0.9530 on an AVX-512 VNNI host; on AVX2, ORT's u8s8 kernels saturate
    # (0.906 in bench_trained there) and plain calibrate() is ahead.
    assert ours >= peer - 0.005, (ours, peer)
    assert ours > 0.9
    # What a user acts on: a range method that clips the tails beats ORT's MinMax everywhere.
    torch._dynamo.reset()
    better = _compiled(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bpu.calibrate(better, calib, method="percentile")
    assert _mean(better, test, refs) > peer + 0.01, peer


@pytest.mark.parametrize("name", list(trained.MODELS))
def test_target_reaches_the_output_cosine(name, capsys) -> None:
    """calibrate(target=0.999) on every trained network: met, on every output of every
    calibration sample (16, all judged by the ladder), >= 0.99 on held-out photos, the moves
    printed; a recompile finds the scales and the precision choice again."""
    missing = trained.available(name)
    if missing:
        pytest.skip(missing)
    entry = trained.MODELS[name]
    model = entry.build()
    calib = entry.samples(trained.CALIB_PHOTOS, entry.calib_per_photo, 1)
    test = entry.samples(trained.TEST_PHOTOS, max(1, entry.test_per_photo // 2), 2)
    assert len(calib) == 16
    with torch.no_grad():
        calib_refs = [output_tensors(model(x)) for x in calib]
        refs = [output_tensors(model(x)) for x in test]
    compiled = _compiled(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = bpu.calibrate(compiled, calib, method="auto", target=0.999)
    assert cal.changes and all(c["met"] for c in cal.changes), cal.changes
    moved = sum(len(c["int16"]) + len(c["dual_int16"]) + len(c["float"]) for c in cal.changes)
    assert moved > 0  # int8 alone is below the target on each of these
    assert "target 0.999 met" in capsys.readouterr().out
    # the ladder's own measure is the float ONNX partition; the torch model differs by rounding
    assert _worst(compiled, calib, calib_refs) >= 0.999 - 2e-4
    assert _mean_all(compiled, test, refs) >= 0.99
    torch._dynamo.reset()  # a recompile finds the scales and the int16 / float choice again
    again = torch.compile(model, backend="bpu", options={"executor": "sim", "cache": False})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _mean_all(again, test, refs) >= 0.99
    assert not [w for w in caught if "no calibration" in str(w.message)]


def _per_sample(run, xs, refs) -> list[float]:
    """Per sample, its worst output's cosine against fp32."""
    with torch.no_grad():
        return [
            min(cosine(a, b) for a, b in zip(output_tensors(run(x)), r, strict=True))
            for x, r in zip(xs, refs, strict=True)
        ]


def _worst(run, xs, refs) -> float:
    return min(_per_sample(run, xs, refs))


def _mean_all(run, xs, refs) -> float:
    values = _per_sample(run, xs, refs)
    return sum(values) / len(values)

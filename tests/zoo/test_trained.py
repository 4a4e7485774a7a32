"""Trained weights on real photos (tests/support/trained.py): ImageNet MobileNetV2 features.

- plain `calibrate()` matches ONNX Runtime's static quantizer with the same (symmetric int8,
  MinMax) scheme on the same calibration and held-out crops, and `method="percentile"` beats it;
- `calibrate(target=0.999)` reaches feature cosine >= 0.99 on held-out crops of other photos
  (the issue's target), says how many tensors it moved, and keeps them across a recompile.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_fl.bpu as bpu
from tests.support import trained
from tests.support.public_zoo import cosine

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


def test_target_reaches_the_feature_cosine(setup, capsys) -> None:
    model, calib, test, refs = setup
    compiled = _compiled(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = bpu.calibrate(compiled, calib, method="auto", target=0.999)
    (change,) = cal.changes
    assert change["met"] and change["int16"], change
    assert "target 0.999 met" in capsys.readouterr().out
    assert _mean(compiled, test, refs) >= 0.99
    torch._dynamo.reset()  # a recompile finds the scales and the int16 / float choice again
    again = torch.compile(model, backend="bpu", options={"executor": "sim", "cache": False})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _mean(again, test, refs) >= 0.99
    assert not [w for w in caught if "no calibration" in str(w.message)]

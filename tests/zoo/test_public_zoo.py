"""Public architectures (torchvision, timm, transformers) through backend="bpu" under `sim`.

Per model: the compile and a calibration on 4 random samples do not crash, every accepted
partition exports and runs int8 (executor="sim" raises where one does not), coverage and
partition count meet the model's row in `EXPECTED`, and the calibrated output's cosine against
fp32 meets it too. The rows are the measured state (docs/compile-models.md, *Public
architectures*): a regression fails, and a row below the issue's target (>= 98 % in <= 2
partitions, cosine >= 0.999) says why in its note.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_fl.bpu as bpu
from tests.support.public_zoo import MODELS, available, build, cosine, output_tensors, samples

# The random-weight CNNs below 0.95 swing by up to 0.03 with fp32 summation order alone (torch's
# thread count, or scales replayed from a calibration another process computed): their ranges
# move by 1e-7 and int8 rounding follows (measured on an AVX-512 VNNI host: RegNet 0.885-0.915,
# MobileNetV3 0.910-0.930, EfficientNet-B0 (timm) 0.894-0.924), so their floors sit that far down.
# model: (min coverage %, max partitions, min calibrated cosine): the measured state, a little
# below it (docs/compile-models.md, *Public architectures*, one run of
# scripts/bench_public_zoo.py). The CNNs below 0.999 are at the limit of int8 with per-tensor
# activation scales on random weights (ONNX Runtime's own quantizer is lower on every one of
# them); int16 for their sensitive layers is the way up. RoBERTa / BERT keep their integer
# position and token-type arithmetic on the CPU (int64 ops: not BPU work).
EXPECTED: dict[str, tuple[float, int, float]] = {
    "tv_resnet18": (100.0, 1, 0.99),
    "tv_mobilenet_v2": (100.0, 1, 0.86),
    "tv_mobilenet_v3_large": (100.0, 1, 0.89),
    "tv_alexnet": (100.0, 1, 0.999),
    "tv_efficientnet_b0": (100.0, 1, 0.85),
    "tv_shufflenet_v2_x0_5": (100.0, 1, 0.83),
    "tv_squeezenet1_1": (100.0, 1, 0.999),
    "tv_regnet_y_400mf": (100.0, 1, 0.88),
    "tv_swin_v2_t": (100.0, 1, 0.99),
    "timm_efficientnet_b0": (100.0, 1, 0.87),
    "timm_mobilevitv2_050": (100.0, 1, 0.85),
    "timm_fastvit_t8": (100.0, 1, 0.995),
    "timm_convnextv2_atto": (100.0, 1, 0.999),
    "hf_gpt2": (100.0, 1, 0.999),
    "hf_llama": (100.0, 1, 0.999),
    "hf_qwen2": (100.0, 1, 0.999),
    "hf_bert": (97.0, 1, 0.999),
    "hf_roberta": (80.0, 1, 0.999),
}


def test_every_model_has_an_expectation():
    assert set(EXPECTED) == set(MODELS)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_public_model(name):
    if not available(MODELS[name].library):
        pytest.fail(f"{MODELS[name].library} is not installed (scripts/bootstrap.sh installs it)")
    min_cov, max_parts, min_cos = EXPECTED[name]
    model, inputs = build(name)
    compiled = torch.compile(model, backend="bpu", options={"executor": "sim"})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bpu.calibrate(compiled, samples(inputs, 4, seed=1))
        rep = bpu.explain(compiled, *inputs)
        out = compiled(*inputs)
        ref = model(*inputs)
    assert rep.coverage_pct >= min_cov and len(rep.partitions) <= max_parts, rep.table()
    assert all(p.executor == "sim" for p in rep.partitions), rep.table()
    assert all(p.calibration and p.calibration["state"] == "calibrated" for p in rep.partitions)
    pairs = [(a, b) for a, b in zip(output_tensors(out), output_tensors(ref), strict=True)]
    cos = min(cosine(a, b) for a, b in pairs if a.is_floating_point() and a.numel())
    assert cos >= min_cos, f"{name}: cosine {cos:.5f} < {min_cos}\n{rep.table()}"

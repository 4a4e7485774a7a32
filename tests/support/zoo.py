"""Public architecture families, written here from their papers' descriptions (no torchvision).

One model per family a user is likely to compile: a plain CNN (ResNet-18), depthwise + squeeze-
excitation (MobileNetV3-Small), channel shuffle (ShuffleNetV2), ConvNeXt (LayerNorm over permuted
channels), ViT (nn.MultiheadAttention), Swin (shifted windows, relative position bias, SDPA with a
mask), an encoder-decoder with bilinear upsampling (DeepLabV3-style ASPP), nn.TransformerEncoder
and a CNN with a GRU head. `build(name, scale)` gives the published configuration at
scale="bench" (224x224) and a narrower/shallower one with the same structure at scale="test".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tests.support.models import ResNet18, seeded

# -- MobileNetV3-Small -------------------------------------------------------------------------


class ConvBnAct(nn.Sequential):
    def __init__(self, c_in, c_out, k=3, stride=1, groups=1, act=nn.ReLU, dilation=1) -> None:
        pad = (k - 1) // 2 * dilation
        layers = [
            nn.Conv2d(c_in, c_out, k, stride, pad, dilation=dilation, groups=groups, bias=False),
            nn.BatchNorm2d(c_out),
        ]
        if act is not None:
            layers.append(act())
        super().__init__(*layers)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(channels, squeeze, 1)
        self.expand = nn.Conv2d(squeeze, channels, 1)

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        s = F.hardsigmoid(self.expand(F.relu(self.reduce(s))))
        return x * s


def _divisible(v: float, d: int = 8) -> int:
    return max(d, int(v + d / 2) // d * d)


class InvertedResidual(nn.Module):
    def __init__(self, c_in, k, exp, c_out, se, act, stride, dilation=1) -> None:
        super().__init__()
        self.residual = stride == 1 and c_in == c_out
        layers: list[nn.Module] = []
        if exp != c_in:
            layers.append(ConvBnAct(c_in, exp, 1, act=act))
        layers.append(ConvBnAct(exp, exp, k, stride, groups=exp, act=act, dilation=dilation))
        if se:
            layers.append(SqueezeExcite(exp, _divisible(exp // 4)))
        layers.append(ConvBnAct(exp, c_out, 1, act=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        y = self.block(x)
        return x + y if self.residual else y


# kernel, expansion, out, squeeze-excite, activation, stride (the paper's Small table)
_MBV3_SMALL = [
    (3, 16, 16, True, nn.ReLU, 2),
    (3, 72, 24, False, nn.ReLU, 2),
    (3, 88, 24, False, nn.ReLU, 1),
    (5, 96, 40, True, nn.Hardswish, 2),
    (5, 240, 40, True, nn.Hardswish, 1),
    (5, 240, 40, True, nn.Hardswish, 1),
    (5, 120, 48, True, nn.Hardswish, 1),
    (5, 144, 48, True, nn.Hardswish, 1),
    (5, 288, 96, True, nn.Hardswish, 2),
    (5, 576, 96, True, nn.Hardswish, 1),
    (5, 576, 96, True, nn.Hardswish, 1),
]


class MobileNetV3Small(nn.Module):
    def __init__(self, num_classes: int = 1000, width: float = 1.0, features_only=False) -> None:
        super().__init__()
        c = _divisible(16 * width)
        layers: list[nn.Module] = [ConvBnAct(3, c, 3, 2, act=nn.Hardswish)]
        for k, exp, out, se, act, stride in _MBV3_SMALL:
            exp, out = _divisible(exp * width), _divisible(out * width)
            layers.append(InvertedResidual(c, k, exp, out, se, act, stride))
            c = out
        self.last_channels = 6 * c
        layers.append(ConvBnAct(c, self.last_channels, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.features_only = features_only
        self.classifier = nn.Sequential(
            nn.Linear(self.last_channels, 1024),
            nn.Hardswish(),
            nn.Dropout(0.2),
            nn.Linear(1024, num_classes),
        )

    def forward(self, x):
        x = self.features(x)
        if self.features_only:
            return x
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# -- ShuffleNetV2 ------------------------------------------------------------------------------


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    b, c, h, w = x.shape
    x = x.view(b, groups, c // groups, h, w).transpose(1, 2).contiguous()
    return x.view(b, c, h, w)


class ShuffleUnit(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        half = c_out // 2
        if stride > 1:
            self.branch1 = nn.Sequential(
                ConvBnAct(c_in, c_in, 3, stride, groups=c_in, act=None),
                ConvBnAct(c_in, half, 1),
            )
        b2_in = c_in if stride > 1 else half
        self.branch2 = nn.Sequential(
            ConvBnAct(b2_in, half, 1),
            ConvBnAct(half, half, 3, stride, groups=half, act=None),
            ConvBnAct(half, half, 1),
        )

    def forward(self, x):
        if self.stride == 1:
            a, b = x.chunk(2, dim=1)
            out = torch.cat((a, self.branch2(b)), 1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), 1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    def __init__(self, repeats=(4, 8, 4), channels=(24, 116, 232, 464, 1024), num_classes=1000):
        super().__init__()
        self.stem = nn.Sequential(ConvBnAct(3, channels[0], 3, 2), nn.MaxPool2d(3, 2, 1))
        stages: list[nn.Module] = []
        c = channels[0]
        for n, out in zip(repeats, channels[1:4], strict=True):
            stages.append(ShuffleUnit(c, out, 2))
            stages += [ShuffleUnit(out, out, 1) for _ in range(n - 1)]
            c = out
        self.stages = nn.Sequential(*stages)
        self.last = ConvBnAct(c, channels[4], 1)
        self.fc = nn.Linear(channels[4], num_classes)

    def forward(self, x):
        x = self.last(self.stages(self.stem(x)))
        return self.fc(x.mean((2, 3)))


# -- ConvNeXt ----------------------------------------------------------------------------------


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor (permute to NHWC and back)."""

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int, layer_scale: float = 1e-6) -> None:
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), layer_scale))

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.fc2(F.gelu(self.fc1(self.norm(y))))
        return x + (self.gamma * y).permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, dims=(96, 192, 384, 768), depths=(3, 3, 9, 3), num_classes=1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0], eps=1e-6)]
        for i, (dim, depth) in enumerate(zip(dims, depths, strict=True)):
            if i:
                layers += [LayerNorm2d(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], dim, 2, 2)]
            layers += [ConvNeXtBlock(dim, layer_scale=0.1) for _ in range(depth)]
        self.features = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head = nn.Linear(dims[-1], num_classes)

    def forward(self, x):
        return self.head(self.norm(self.features(x).mean((2, 3))))


# -- ViT ---------------------------------------------------------------------------------------


class ViTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(), nn.Linear(mlp, dim))

    def forward(self, x):
        y = self.norm1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(self, image=224, patch=16, dim=384, depth=12, heads=6, num_classes=1000) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        tokens = (image // patch) ** 2 + 1
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, tokens, dim) * 0.02)
        self.blocks = nn.Sequential(*[ViTBlock(dim, heads, 4 * dim) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls.expand(x.shape[0], -1, -1), x), 1) + self.pos
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


# -- Swin --------------------------------------------------------------------------------------


def _relative_index(window: int) -> torch.Tensor:
    coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij"))
    flat = coords.flatten(1)
    rel = (flat[:, :, None] - flat[:, None, :]).permute(1, 2, 0) + (window - 1)
    return (rel[..., 0] * (2 * window - 1) + rel[..., 1]).flatten()


class WindowAttention(nn.Module):
    def __init__(self, dim: int, heads: int, window: int, shift: int) -> None:
        super().__init__()
        self.heads, self.window, self.shift = heads, window, shift
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.bias_table = nn.Parameter(torch.randn((2 * window - 1) ** 2, heads) * 0.02)
        self.register_buffer("bias_index", _relative_index(window), persistent=False)

    def _shift_mask(self, hp: int, wp: int, device) -> torch.Tensor:
        """-100 between tokens of a shifted window that came from different image regions."""
        w, s = self.window, self.shift
        region = torch.zeros(hp, wp, device=device)
        label = 0
        for hs in (slice(0, -w), slice(-w, -s), slice(-s, None)):
            for ws in (slice(0, -w), slice(-w, -s), slice(-s, None)):
                region[hs, ws] = label
                label += 1
        region = region.view(hp // w, w, wp // w, w).transpose(1, 2).reshape(-1, w * w)
        diff = region.unsqueeze(1) - region.unsqueeze(2)
        return diff.masked_fill(diff != 0, -100.0).masked_fill(diff == 0, 0.0)

    def forward(self, x):  # x: B, H, W, C
        b, h, w_, c = x.shape
        win = self.window
        pad_h, pad_w = (win - h % win) % win, (win - w_ % win) % win
        x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
        hp, wp = h + pad_h, w_ + pad_w
        shift = self.shift if win < min(hp, wp) else 0
        if shift:
            x = torch.roll(x, (-shift, -shift), (1, 2))
        nh, nw = hp // win, wp // win
        x = x.view(b, nh, win, nw, win, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, win * win, c)
        qkv = self.qkv(x).reshape(x.shape[0], win * win, 3, self.heads, c // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        bias = self.bias_table[self.bias_index].view(win * win, win * win, -1).permute(2, 0, 1)
        mask = bias.unsqueeze(0)  # 1, heads, N, N
        if shift:
            windows_mask = self._shift_mask(hp, wp, x.device)  # nW, N, N
            mask = (mask.unsqueeze(0) + windows_mask[None, :, None]).reshape(
                -1, self.heads, win * win, win * win
            )
            mask = mask.repeat(b, 1, 1, 1) if b > 1 else mask
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = self.proj(y.transpose(1, 2).reshape(-1, win * win, c))
        y = y.view(b, nh, nw, win, win, c).permute(0, 1, 3, 2, 4, 5).reshape(b, hp, wp, c)
        if shift:
            y = torch.roll(y, (shift, shift), (1, 2))
        return y[:, :h, :w_, :].contiguous()


class SwinBlock(nn.Module):
    def __init__(self, dim: int, heads: int, window: int, shift: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, heads, window, shift)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PatchMerging(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim)
        self.reduce = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x):  # B, H, W, C
        x = F.pad(x, (0, 0, 0, x.shape[2] % 2, 0, x.shape[1] % 2))
        parts = (x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2])
        return self.reduce(self.norm(torch.cat(parts, -1)))


class Swin(nn.Module):
    def __init__(
        self, dim=96, depths=(2, 2, 6, 2), heads=(3, 6, 12, 24), window=7, num_classes=1000
    ) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 4, 4)
        self.patch_norm = nn.LayerNorm(dim)
        layers: list[nn.Module] = []
        for i, (depth, h) in enumerate(zip(depths, heads, strict=True)):
            d = dim * 2**i
            if i:
                layers.append(PatchMerging(d // 2))
            layers += [
                SwinBlock(d, h, window, 0 if j % 2 == 0 else window // 2) for j in range(depth)
            ]
        self.layers = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(dim * 2 ** (len(depths) - 1))
        self.head = nn.Linear(dim * 2 ** (len(depths) - 1), num_classes)

    def forward(self, x):
        x = self.patch_norm(self.patch(x).permute(0, 2, 3, 1))
        x = self.norm(self.layers(x))
        return self.head(x.mean((1, 2)))


# -- DeepLabV3-style encoder-decoder -----------------------------------------------------------


class ASPP(nn.Module):
    def __init__(self, c_in: int, c_out: int = 128, rates=(6, 12, 18)) -> None:
        super().__init__()
        self.branches = nn.ModuleList([ConvBnAct(c_in, c_out, 1)])
        self.branches.extend(ConvBnAct(c_in, c_out, 3, dilation=r) for r in rates)
        self.pool = ConvBnAct(c_in, c_out, 1)
        self.project = ConvBnAct(c_out * (len(rates) + 2), c_out, 1)

    def forward(self, x):
        outs = [branch(x) for branch in self.branches]
        pooled = self.pool(F.adaptive_avg_pool2d(x, 1))
        outs.append(F.interpolate(pooled, size=x.shape[-2:], mode="bilinear", align_corners=False))
        return self.project(torch.cat(outs, 1))


class DeepLabV3(nn.Module):
    def __init__(self, num_classes: int = 21, width: float = 1.0, aspp: int = 128) -> None:
        super().__init__()
        self.backbone = MobileNetV3Small(width=width, features_only=True)
        self.aspp = ASPP(self.backbone.last_channels, aspp)
        self.head = nn.Sequential(ConvBnAct(aspp, aspp, 3), nn.Conv2d(aspp, num_classes, 1))

    def forward(self, x):
        y = self.head(self.aspp(self.backbone(x)))
        return F.interpolate(y, size=x.shape[-2:], mode="bilinear", align_corners=False)


# -- nn.TransformerEncoder, GRU head -------------------------------------------------------------


class TextEncoder(nn.Module):
    """nn.TransformerEncoder over a token sequence (inputs are embeddings: B, T, d)."""

    def __init__(self, d=256, heads=8, layers=4, ff=1024, num_classes=10) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, num_classes)

    def forward(self, x):
        return self.head(self.encoder(x).mean(1))


class ConvGRU(nn.Module):
    """A small CNN reading columns of a spectrogram-like input, then a GRU and a classifier."""

    def __init__(self, channels=64, hidden=128, num_classes=30) -> None:
        super().__init__()
        self.cnn = nn.Sequential(
            ConvBnAct(1, channels // 2, 3, 2), ConvBnAct(channels // 2, channels, 3, 2)
        )
        self.gru = nn.GRU(channels, hidden, batch_first=True)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x):  # B, 1, F, T
        y = self.cnn(x).mean(2).transpose(1, 2)  # B, T', C
        out, _ = self.gru(y)
        return self.head(out[:, -1])


@dataclass(frozen=True)
class ZooEntry:
    name: str
    family: str
    make: Callable[[str], nn.Module]
    input_shape: Callable[[str], tuple[int, ...]]


def _image(test: int, bench: int = 224) -> Callable[[str], tuple[int, ...]]:
    return lambda scale: (1, 3, bench, bench) if scale == "bench" else (1, 3, test, test)


def _pick(scale: str, bench, test):
    return bench() if scale == "bench" else test()


ZOO: dict[str, ZooEntry] = {
    e.name: e
    for e in (
        ZooEntry(
            "resnet18", "plain CNN", lambda s: ResNet18(1000 if s == "bench" else 10), _image(64)
        ),
        ZooEntry(
            "mobilenetv3_small",
            "depthwise + squeeze-excite",
            lambda s: _pick(s, MobileNetV3Small, lambda: MobileNetV3Small(10, width=0.5)),
            _image(64),
        ),
        ZooEntry(
            "shufflenetv2",
            "channel shuffle",
            lambda s: _pick(
                s, ShuffleNetV2, lambda: ShuffleNetV2((2, 2, 2), (16, 32, 64, 128, 256), 10)
            ),
            _image(64),
        ),
        ZooEntry(
            "convnext",
            "LayerNorm over permuted channels",
            lambda s: _pick(s, ConvNeXt, lambda: ConvNeXt((32, 64, 128, 256), (1, 1, 2, 1), 10)),
            _image(64),
        ),
        ZooEntry(
            "vit",
            "ViT (nn.MultiheadAttention)",
            lambda s: _pick(s, ViT, lambda: ViT(64, 16, 96, 2, 3, 10)),
            _image(64),
        ),
        ZooEntry(
            "swin",
            "shifted windows",
            lambda s: _pick(s, Swin, lambda: Swin(32, (2, 2, 2, 2), (1, 2, 4, 8), 4, 10)),
            _image(64),
        ),
        ZooEntry(
            "deeplabv3",
            "encoder-decoder, bilinear upsampling",
            lambda s: _pick(s, DeepLabV3, lambda: DeepLabV3(5, width=0.5, aspp=32)),
            _image(64),
        ),
        ZooEntry(
            "transformer_encoder",
            "nn.TransformerEncoder",
            lambda s: _pick(s, TextEncoder, lambda: TextEncoder(64, 4, 2, 128)),
            lambda s: (1, 128, 256) if s == "bench" else (1, 16, 64),
        ),
        ZooEntry(
            "conv_gru",
            "CNN + GRU head",
            lambda s: _pick(s, ConvGRU, lambda: ConvGRU(32, 32, 10)),
            lambda s: (1, 1, 64, 256) if s == "bench" else (1, 1, 32, 64),
        ),
    )
}


def build(name: str, scale: str = "test", seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    """The model (deterministic weights, eval) and one input at `scale` ("test" or "bench")."""
    entry = ZOO[name]
    torch.manual_seed(seed)  # parameters made outside reset_parameters (tokens, bias tables)
    model = seeded(entry.make(scale), seed)
    generator = torch.Generator().manual_seed(seed + 1)
    return model, torch.randn(entry.input_shape(scale), generator=generator)

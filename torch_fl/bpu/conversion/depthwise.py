"""Depthwise 8-bit convolutions of ONNX Runtime's optimized sim graph as the extension's own op.

ONNX Runtime runs each depthwise conv of an integer graph as a channels-last QLinearConv. Its
AVX-512 kernel is fast where the channel count is a multiple of 16 and slow elsewhere: by its
profiler (MobileNetV3, batch 1, 1 thread, AVX512-VNNI EPYC), 3x3 over 88 channels at 28x28
55.4 us, 5x5 over 120 at 14x14 41.6 us, against 26.5 us for 5x5 over 240 at 14x14, twice the
work. The extension's op took 24.2, 19.2 and 33.5 us there (the next profiler run): it wins
where ORT's kernel runs a remainder of channels and loses on whole multiples of 16 (also 144,
288, 576), so only convs with `channels % ALIGNED_CHANNELS != 0` move to it. This pass
replaces each such node, in ORT's optimized form of the graph (where the convs already run
channels-last and the transposes between them are gone: conversion/lookups.py), with
`torch_fl.bpu.DepthwiseConvU8` / `I8` (csrc/runtime/ort_depthwise.cpp): float multiply-adds
over the integers `q_x - zp_x` and `q_w - zp_w`, which are exact where each output channel's
sum of |q_w - zp_w| times the largest |q_x - zp_x|, plus |bias|, stays below 2^24 (checked here
per channel; a conv beyond it stays ORT's), then ORT's own requantization with its scale
`x_scale * w_scale / y_scale` formed in float32 in that order (conversion/qlinear_conv.py).
The result is QLinearConv's byte for byte (tests/compile/test_depthwise.py holds them equal
over strides, dilations, pads, zero points, weight types and batch).

Only where the op has a vector form (`torch_fl._C._depthwise_kernel()` "avx512" or "avx2"): the
plain loop it falls back to elsewhere is exact but no faster than ORT's kernel; the executor
asks (runtime/executors.py) and explain() says which. ORT's AVX2 kernel is slow on the same
channel counts (scripts/bench_conv_ops.py, docs/compile.md), so one rule serves both forms;
moving the aligned ones too on AVX2 was tried and undone (MobileNetV2's session 1.1x slower:
docs/compile.md, *Depthwise convolutions on the extension's op*).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from torch_fl.bpu.conversion.export import attribute
from torch_fl.bpu.conversion.lookups import DOMAIN, import_domain
from torch_fl.bpu.conversion.qlinear_conv import RANGE, ConvParts, conv_parts, drop_unread

__all__ = [
    "ALIGNED_CHANNELS",
    "EXACT_BELOW",
    "OPS",
    "candidates",
    "exact",
    "replace_convs",
    "rewrite_depthwise",
]

ALIGNED_CHANNELS = 16
"""A depthwise conv whose channel count is a multiple of this stays ORT's (its AVX-512 kernel's
block: see above)."""
EXACT_BELOW = 2**24
"""Integers below this are exact in float32, and so is every sum of them that stays below it."""
OPS = {TensorProto.UINT8: "DepthwiseConvU8", TensorProto.INT8: "DepthwiseConvI8"}


def candidates(model: onnx.ModelProto) -> int:
    """How many convs of the integer graph `model` (before ORT's optimizer, which fuses its
    DQ -> Conv -> Q into QLinearConv) may qualify: grouped, the group count not a multiple of
    `ALIGNED_CHANNELS`; `rewrite_depthwise` decides each on ORT's optimized graph."""
    count = 0
    for node in model.graph.node:
        if node.op_type in ("Conv", "QLinearConv"):
            group = attribute(node, "group", 1)
            count += group > 1 and group % ALIGNED_CHANNELS != 0
    return count


def rewrite_depthwise(model: onnx.ModelProto, form: int = 0, every_width: bool = False) -> int:
    """Replace, in place, each qualifying channels-last depthwise QLinearConv of ORT's optimized
    `model` with a DepthwiseConv op; returns how many. `form` 1 asks the op for its plain loop;
    `every_width` takes multiples of `ALIGNED_CHANNELS` too (tests compare the forms)."""
    return replace_convs(model, lambda node, inits: _plan(node, inits, every_width), form)


Plan = Callable[[onnx.NodeProto, dict], "dict | None"]
"""A conv's op inputs (`type`, `op`, `prefix`, `weights`, `bias`, `scale`, `geometry`, its
last value the form), or None where the node stays ORT's."""


def replace_convs(model: onnx.ModelProto, plan: Plan, form: int) -> int:
    """Replace, in place, each node of `model` that `plan` takes with the extension's op it
    names; returns how many (conversion/grouped_conv.py shares this)."""
    inits = {i.name: i for i in model.graph.initializer}
    added: list[onnx.TensorProto] = []
    count = 0
    for index, node in enumerate(model.graph.node):
        taken = plan(node, inits)
        if taken is None:
            continue
        prefix = f"{taken['prefix']}::{node.name or node.output[0]}"
        names = [f"{prefix}/{part}" for part in ("weights", "bias", "scale", "geometry")]
        taken["geometry"][-1] = form
        arrays = (taken["weights"], taken["bias"], taken["scale"], taken["geometry"])
        added += [numpy_helper.from_array(a, n) for a, n in zip(arrays, names, strict=True)]
        op = helper.make_node(
            taken["op"], [node.input[0], *names], [node.output[0]], name=prefix, domain=DOMAIN
        )
        model.graph.node[index].CopyFrom(op)
        count += 1
    if count:
        model.graph.initializer.extend(added)
        drop_unread(model)
        import_domain(model)
    return count


def exact(conv: ConvParts) -> bool:
    """Whether every accumulator of `conv` is exact in float32: per output channel, the sum of
    its |w| times the widest |x - zp_x|, plus |bias|, below `EXACT_BELOW`."""
    lo, hi = RANGE[conv.x_type]
    widest = max(conv.zp_x - lo, hi - conv.zp_x)
    taps = conv.taps.reshape(conv.taps.shape[0], -1)
    bound = np.abs(taps).sum(axis=1) * widest + np.abs(conv.bias)
    return int(bound.max()) < EXACT_BELOW


def _plan(node: onnx.NodeProto, inits: dict, every_width: bool) -> dict | None:
    """The DepthwiseConv inputs for `node`, or None where it is not a channels-last 2-D
    depthwise QLinearConv with constant parameters inside the exactness bound."""
    conv = conv_parts(node, inits)
    if conv is None:
        return None
    channels = conv.taps.shape[0]
    if conv.taps.shape[1] != 1 or conv.group != channels or channels < 2:
        return None
    if channels % ALIGNED_CHANNELS == 0 and not every_width:
        return None
    if not exact(conv):
        return None
    return {
        "type": conv.x_type,
        "op": OPS[conv.x_type],
        "prefix": "depthwise",
        "weights": np.ascontiguousarray(conv.taps.reshape(channels, -1).T.astype(np.float32)),
        "bias": conv.bias.astype(np.float32),
        "scale": conv.scale,
        "geometry": np.array([*conv.geometry(), 0], np.int64),
    }

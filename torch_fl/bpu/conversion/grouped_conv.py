"""Grouped 8-bit convolutions of narrow groups in ONNX Runtime's optimized sim graph as the
extension's own op.

ONNX Runtime runs a grouped QLinearConv that is not depthwise as one small GEMM per group, as
many columns as the group has outputs. Where a group is a few channels wide (RegNet's 8, ResNeXt's
4 to 32) that GEMM is mostly overhead: RegNetY-400MF's first grouped 3x3 (48 channels in 6
groups, stride 2, 112x112 input, 10.8 M multiply-adds) took 1.03 ms by ORT's profiler (batch 1,
1 thread, AVX512-VNNI EPYC), a tenth of the rate its 1x1 convs reach. This pass replaces each
such channels-last QLinearConv with `torch_fl.bpu.GroupedConvU8` / `I8`
(csrc/runtime/ort_depthwise.cpp): the depthwise op's float multiply-adds over the integers,
summed over the G inputs of each group, then ORT's own requantization; exact where each output
channel's accumulator bound stays below 2^24 (conversion/depthwise.py `exact`). The result is
QLinearConv's byte for byte (tests/compile/test_grouped_conv.py).

Only where the op has its AVX-512 form (`torch_fl._C._depthwise_kernel() == "avx512"`, the same
kernel), and only for the group shapes its AVX-512 form lays out with one instruction a plane:
groups as wide as their outputs with G dividing 16 (a permute within 16 channels), or groups
whose outputs fill whole blocks of 16 (a broadcast), G at most `MAX_GROUP_WIDTH`.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from torch_fl.bpu.conversion.depthwise import exact, replace_convs
from torch_fl.bpu.conversion.export import attribute
from torch_fl.bpu.conversion.qlinear_conv import conv_parts

__all__ = ["MAX_GROUP_WIDTH", "OPS", "candidates", "fits", "rewrite_grouped"]

MAX_GROUP_WIDTH = 8
"""Input channels a group, at most, of a conv this pass takes (see `fits`)."""
OPS = {TensorProto.UINT8: "GroupedConvU8", TensorProto.INT8: "GroupedConvI8"}
LANES = 16
"""Floats in one AVX-512 register: the op's block of output channels."""


def fits(width: int, outputs_per_group: int) -> bool:
    """Whether a grouped conv of `width` inputs and `outputs_per_group` outputs a group (not
    depthwise: that is conversion/depthwise.py's) is one this pass takes."""
    if width < 1 or width > MAX_GROUP_WIDTH or (width == 1 and outputs_per_group == 1):
        return False
    permute = width == outputs_per_group and LANES % width == 0
    return permute or outputs_per_group % LANES == 0


def candidates(model: onnx.ModelProto) -> int:
    """How many convs of the integer graph `model` (before ORT's optimizer) may qualify: grouped
    and not depthwise, with groups that `fits` where the weights say (an initializer, or the
    one a DequantizeLinear reads), counted where they do not say."""
    inits = {i.name: i for i in model.graph.initializer}
    producers = {out: n for n in model.graph.node for out in n.output}
    count = 0
    for node in model.graph.node:
        if node.op_type not in ("Conv", "QLinearConv"):
            continue
        group = attribute(node, "group", 1)
        if group < 2:
            continue
        dims = _weight_dims(node, inits, producers)
        if dims is None:
            count += 1
        elif len(dims) == 4 and dims[0] % group == 0:
            count += fits(int(dims[1]), int(dims[0]) // group)
    return count


def _weight_dims(node: onnx.NodeProto, inits: dict, producers: dict) -> list[int] | None:
    name = node.input[3] if node.op_type == "QLinearConv" else node.input[1]
    source = producers.get(name)
    if source is not None and source.op_type == "DequantizeLinear":
        name = source.input[0]
    init = inits.get(name)
    return list(init.dims) if init is not None else None


def rewrite_grouped(model: onnx.ModelProto, form: int = 0, every_shape: bool = False) -> int:
    """Replace, in place, each qualifying channels-last grouped QLinearConv of ORT's optimized
    `model` with a GroupedConv op; returns how many. `form` 1 asks the op for its plain loop;
    `every_shape` takes groups that do not `fits` too (the op runs them in its plain loop, or
    wide ones slower than ORT: tests compare the forms)."""
    return replace_convs(model, lambda node, inits: _plan(node, inits, every_shape), form)


def _plan(node: onnx.NodeProto, inits: dict, every_shape: bool) -> dict | None:
    """The GroupedConv inputs for `node`, or None where it is not a channels-last 2-D grouped
    QLinearConv whose groups `fits`, with constant parameters inside the exactness bound."""
    conv = conv_parts(node, inits)
    if conv is None or conv.group < 2:
        return None
    outputs, width = conv.taps.shape[:2]
    if outputs % conv.group != 0 or (width == 1 and outputs == conv.group):
        return None  # depthwise: conversion/depthwise.py's
    if not (every_shape or fits(width, outputs // conv.group)):
        return None
    if not exact(conv):
        return None
    # [CO, G, KH, KW] -> [G, KH * KW, CO]: the op's planes, tap-major, outputs innermost
    weights = conv.taps.reshape(outputs, width, -1).transpose(1, 2, 0)
    return {
        "type": conv.x_type,
        "op": OPS[conv.x_type],
        "prefix": "grouped",
        "weights": np.ascontiguousarray(weights.astype(np.float32)),
        "bias": conv.bias.astype(np.float32),
        "scale": conv.scale,
        "geometry": np.array([*conv.geometry(), width, 0], np.int64),
    }

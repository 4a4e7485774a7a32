"""Grouped 8-bit convolutions of narrow groups in ONNX Runtime's optimized sim graph as the
extension's own ops.

ONNX Runtime runs a grouped QLinearConv that is not depthwise as one small GEMM per group, as
many columns as the group has outputs. Where a group is a few channels wide (RegNet's 8 to 16,
ResNeXt's 4 to 32) that GEMM is mostly overhead: RegNetY-400MF's first grouped 3x3 (48 channels
in 6 groups, stride 2, 112x112 input, 10.8 M multiply-adds) took 1.03 ms by ORT's profiler (batch
1, 1 thread, AVX512-VNNI EPYC), a tenth of the rate its 1x1 convs reach. This pass replaces each
such channels-last QLinearConv with one of two ops, both ORT's `QLinearConv` byte for byte
(tests/compile/test_grouped_conv.py):

- `torch_fl.bpu.GroupedDotConvU8` / `I8` (csrc/runtime/ort_grouped_dot.cpp), where the CPU has
  AVX512-VNNI (`torch_fl._C._narrow_kernel() == "vnni"`): 4 inputs of a group per `vpdpbusd`,
  QLinearConv's own int32 accumulator. For groups a multiple of 4 wide, up to
  `MAX_DOT_WIDTH`, whose outputs fill whole blocks of 16 or that are 4 or 8 wide and as wide as
  their outputs, with weights that fit int8 once their zero point is taken off.
- `torch_fl.bpu.GroupedConvU8` / `I8` (csrc/runtime/ort_depthwise.cpp), where the CPU has
  AVX-512 (`_depthwise_kernel() == "avx512"`) and the dot op does not take the conv: the
  depthwise op's float multiply-adds over the integers, summed over the G inputs of each
  group, then ORT's requantization; exact where each output channel's accumulator bound stays
  below 2^24 (conversion/depthwise.py `exact`). Only for groups of 2 to `MAX_GROUP_WIDTH`
  whose AVX-512 form lays out each input with one instruction (`fits`): its 16 multiply-adds
  an instruction lose to ORT's 8-bit dot products on wider groups.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from torch_fl.bpu.conversion.depthwise import exact, replace_convs
from torch_fl.bpu.conversion.export import attribute
from torch_fl.bpu.conversion.qlinear_conv import ConvParts, conv_parts

__all__ = [
    "DOT_OPS",
    "MAX_DOT_WIDTH",
    "MAX_GROUP_WIDTH",
    "OPS",
    "candidates",
    "dot_fits",
    "fits",
    "rewrite_grouped",
]

MAX_GROUP_WIDTH = 8
"""Input channels a group, at most, of a conv the float op takes (see `fits`)."""
MAX_DOT_WIDTH = 16
"""Input channels a group, at most, of a conv the dot op takes (see `dot_fits`): at 32 it only
matched ORT's GEMM (0.97 to 1.14 of its speed on four shapes), at 64 it lost (0.65, 0.73)."""
OPS = {TensorProto.UINT8: "GroupedConvU8", TensorProto.INT8: "GroupedConvI8"}
DOT_OPS = {TensorProto.UINT8: "GroupedDotConvU8", TensorProto.INT8: "GroupedDotConvI8"}
LANES = 16
"""32-bit lanes in one AVX-512 register: either op's block of output channels."""
WORD = 4
"""Input bytes in one 32-bit word: the dot op's step through a group's inputs."""


def fits(width: int, outputs_per_group: int) -> bool:
    """Whether a grouped conv of `width` inputs and `outputs_per_group` outputs a group (not
    depthwise: that is conversion/depthwise.py's) is one the float op takes."""
    if width < 1 or width > MAX_GROUP_WIDTH or (width == 1 and outputs_per_group == 1):
        return False
    permute = width == outputs_per_group and LANES % width == 0
    return permute or outputs_per_group % LANES == 0


def dot_fits(width: int, outputs_per_group: int) -> bool:
    """Whether a grouped conv of `width` inputs and `outputs_per_group` outputs a group is one
    the dot op takes: a multiple of 4 wide, up to `MAX_DOT_WIDTH`, its outputs filling whole
    blocks of 16 (a broadcast of one word) or 4 or 8 wide and as wide as its outputs (a
    permute of the block's own 4 words)."""
    if width < WORD or width % WORD or width > MAX_DOT_WIDTH:
        return False
    return outputs_per_group % LANES == 0 or (width == outputs_per_group and width in (4, 8))


def candidates(model: onnx.ModelProto) -> int:
    """How many convs of the integer graph `model` (before ORT's optimizer) may qualify: grouped
    and not depthwise, with groups that either op takes where the weights say (an initializer,
    or the one a DequantizeLinear reads), counted where they do not say."""
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
            width, per_group = int(dims[1]), int(dims[0]) // group
            count += fits(width, per_group) or dot_fits(width, per_group)
    return count


def _weight_dims(node: onnx.NodeProto, inits: dict, producers: dict) -> list[int] | None:
    name = node.input[3] if node.op_type == "QLinearConv" else node.input[1]
    source = producers.get(name)
    if source is not None and source.op_type == "DequantizeLinear":
        name = source.input[0]
    init = inits.get(name)
    return list(init.dims) if init is not None else None


def rewrite_grouped(
    model: onnx.ModelProto,
    form: int = 0,
    every_shape: bool = False,
    dot: bool = False,
    floats: bool = True,
) -> int:
    """Replace, in place, each qualifying channels-last grouped QLinearConv of ORT's optimized
    `model` with a GroupedDotConv op where `dot` (the CPU has AVX512-VNNI) and it takes the
    conv, else with a GroupedConv op where `floats`; returns how many. `form` 1 asks the ops
    for their plain loop; `every_shape` takes groups that neither op's shape rule takes too
    (their plain loops run them: tests compare the forms)."""

    def plan(node: onnx.NodeProto, inits: dict) -> dict | None:
        conv = conv_parts(node, inits)
        if conv is None or conv.group < 2:
            return None
        outputs, width = conv.taps.shape[:2]
        if outputs % conv.group != 0 or (width == 1 and outputs == conv.group):
            return None  # depthwise: conversion/depthwise.py's
        per_group = outputs // conv.group
        taken = None
        if dot and (every_shape or dot_fits(width, per_group)):
            taken = _dot_plan(conv)
        if taken is None and floats and (every_shape or fits(width, per_group)):
            taken = _float_plan(conv)
        return taken

    return replace_convs(model, plan, form)


def _float_plan(conv: ConvParts) -> dict | None:
    """The GroupedConv inputs, or None past the exactness bound."""
    if not exact(conv):
        return None
    outputs, width = conv.taps.shape[:2]
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


def _dot_plan(conv: ConvParts) -> dict | None:
    """The GroupedDotConv inputs, or None where the group is not a multiple of 4 wide, a weight
    less its zero point does not fit int8, or the corrected bias does not fit int32."""
    outputs, width = conv.taps.shape[:2]
    taps = conv.taps
    if width % WORD or taps.min(initial=0) < -128 or taps.max(initial=0) > 127:
        return None
    # x's bytes as vpdpbusd's unsigned operand: int8 x shifted by 128, its zero point with it
    zp = conv.zp_x + (128 if conv.x_type == TensorProto.INT8 else 0)
    corr = conv.bias - zp * taps.reshape(outputs, -1).sum(axis=1)
    if corr.min(initial=0) < -(2**31) or corr.max(initial=0) >= 2**31:
        return None
    padded = -(-outputs // LANES) * LANES
    # [CO, G, KH, KW] -> [CO16 / 16, KH * KW, G / 4, 16, 4]: by block of 16 outputs (zeros past
    # CO), then tap, then the group's word, then the block's outputs, then a word's 4 inputs
    words = np.zeros((padded, width // WORD, WORD, taps.shape[2] * taps.shape[3]), np.int8)
    words[:outputs] = taps.reshape(outputs, width // WORD, WORD, -1)
    blocks = words.reshape(padded // LANES, LANES, width // WORD, WORD, -1)
    weights = blocks.transpose(0, 4, 2, 1, 3)
    return {
        "type": conv.x_type,
        "op": DOT_OPS[conv.x_type],
        "prefix": "grouped_dot",
        "weights": np.ascontiguousarray(weights),
        "bias": corr.astype(np.int32),
        "scale": conv.scale,
        "geometry": np.array([*conv.geometry(), width, 0], np.int64),
    }

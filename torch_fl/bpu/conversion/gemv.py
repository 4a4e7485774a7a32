"""One-row 8-bit GEMMs of ONNX Runtime's optimized sim graph as the extension's Gemv op: QGemms
whose A is one row and 1x1 QLinearConvs over one pixel.

ORT fuses each DQ -> Gemm -> Q of an integer graph into a `com.microsoft` QGemm. Where A has
one row (a classifier at batch 1) its kernel runs the product on one thread, and the time is
the weights' trip from memory: by ORT's profiler, MobileNetV3-Small's 576 -> 1024 and
1024 -> 1000 took 60 and 78 us on 1 thread and 59 and 68 on 2 (2-vCPU Xeon with AMX). This pass
replaces each such QGemm with `torch_fl.bpu.Gemv<U8|I8>[F]` (csrc/runtime/ort_gemv.cpp): the
same int32 accumulator on AVX512-VNNI's byte dot products, split over the session's threads by
output columns, then QGemm's own output step. The result is QGemm's byte for byte, or float for
float (tests/compile/test_gemv.py holds them equal over types, zero points, alpha, transposes,
bias or none and float or 8-bit outputs).

A 1x1 conv of stride 1, no pads and one group over channels-last pixels is the same GEMM, its
pixels the rows: a squeeze-excitation block's two convs over the mean of each channel have one
pixel at batch 1 (MobileNetV3-Small has 18 such convs). The op takes its input's leading
dimensions as the rows and gives its output the same ones, so the conv's [N, 1, 1, K] becomes
[N, 1, 1, N_out] as QLinearConv's would; its integer is QLinearConv's ((x - zp_x) * w + bias,
exact in int32 on an exact u8s8 host) and its output step the same requantization
(ort_requant.h). A byte clamp after it folds into that step (conversion/clamp_fold.py). The
sessions gained little by it (0.963 to 0.998 of their time over four networks, 1.011 in one
earlier run: docs/compile.md, *One-row GEMMs on the extension's op*).

Which ones: the row count is read from the integer graph's shapes (`gemm_rows`, by node name:
ORT's fusion keeps a Gemm's and its layout pass writes a conv's as `<name>_token_<n>`), and only
a known single row qualifies: the op runs a row at a time, and a GEMM of many rows is ORT's
kernel's job. Weights, their scales and zero points, C (a conv's bias) and the output's scale
and zero point must be constants, the weights int8 less their zero point (the sim's weights are
symmetric), A not transposed, and every partial sum inside int32.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from torch_fl.bpu.conversion.depthwise import replace_convs
from torch_fl.bpu.conversion.inferred_shapes import InferredShapes, inferred_shapes
from torch_fl.bpu.conversion.qlinear_conv import RANGE, constant, conv_parts, pointwise_weights

__all__ = [
    "OPS",
    "GemmParts",
    "candidates",
    "gemm_parts",
    "gemm_rows",
    "pack_weights",
    "rewrite_gemv",
    "rows_of",
]

OPS = {
    (TensorProto.UINT8, False): "GemvU8",
    (TensorProto.UINT8, True): "GemvU8F",
    (TensorProto.INT8, False): "GemvI8",
    (TensorProto.INT8, True): "GemvI8F",
}
"""The op for a's 8-bit type and whether y is float."""
INT32 = 2**31


_LAYOUT_SUFFIX = re.compile(r"_token_\d+$")
"""What ORT's layout pass appends to the name of a conv it writes channels-last."""


def gemm_rows(model: onnx.ModelProto | InferredShapes) -> dict[str, int]:
    """A's row count of each named Gemm, and the pixel count of each named 1x1 Conv, of the
    integer graph `model` (before ORT's optimizer: `rows_of` finds them by the names of its
    nodes), where shape inference knows the shapes in full."""
    shapes = inferred_shapes(model)
    if shapes.graph is None:
        return {}
    rows = {}
    # a conv's weights: through a DequantizeLinear (inferred) or a float initializer
    dims = {i.name: list(i.dims) for i in shapes.graph.initializer} | shapes.dims
    for node in shapes.graph.node:
        if not node.name or len(node.input) < 2:
            continue
        shape = dims.get(node.input[0])
        if node.op_type == "Gemm" and shape is not None and len(shape) == 2:
            trans_a = next((a.i for a in node.attribute if a.name == "transA"), 0)
            rows[node.name] = shape[1] if trans_a else shape[0]
        elif node.op_type == "Conv" and _is_pointwise(dims.get(node.input[1])):
            out = shapes.dims.get(node.output[0])
            if out is not None and len(out) == 4 and all(d > 0 for d in out):
                rows[node.name] = out[0] * out[2] * out[3]
    return rows


def _is_pointwise(weights: list[int] | None) -> bool:
    return weights is not None and len(weights) == 4 and weights[2:] == [1, 1]


def rows_of(node: onnx.NodeProto, rows: dict[str, int]) -> int | None:
    """The row count `gemm_rows` found for the node of ORT's optimized graph `node` (a QGemm by
    its own name, a channels-last QLinearConv by the name its layout pass derived); None where
    it has none."""
    if node.name in rows:
        return rows[node.name]
    if node.op_type == "QLinearConv":
        return rows.get(_LAYOUT_SUFFIX.sub("", node.name))
    return None


def candidates(rows: dict[str, int]) -> int:
    """How many Gemms and 1x1 Convs of `gemm_rows` have one row: `rewrite_gemv` decides each on
    ORT's graph."""
    return sum(m == 1 for m in rows.values())


def pack_weights(b: np.ndarray) -> np.ndarray:
    """B as [K, N] int8 -> the op's [N16 / 16, K4 / 4, 16, 4] layout, padded with zeros."""
    k, n = b.shape
    k4, n16 = -(-k // 4) * 4, -(-n // 16) * 16
    padded = np.zeros((k4, n16), np.int8)
    padded[:k, :n] = b
    return np.ascontiguousarray(padded.reshape(k4 // 4, 4, n16 // 16, 16).transpose(2, 0, 3, 1))


def rewrite_gemv(model: onnx.ModelProto, rows: dict[str, int], form: int = 0) -> int:
    """Replace, in place, each qualifying QGemm and 1x1 QLinearConv of ORT's optimized `model`
    with one row (by `rows`, from `gemm_rows`) with a Gemv op; returns how many. `form` 1 asks
    the op for its plain loop (tests compare the forms)."""
    return replace_convs(
        model, lambda node, inits: _plan(node, inits) if rows_of(node, rows) == 1 else None, form
    )


@dataclass(frozen=True)
class GemmParts:
    a_type: int
    """TensorProto.UINT8 or INT8: A's type (and an 8-bit y's)."""
    weights: np.ndarray
    """int64 [K, N]: B less its zero point, as A @ B reads it."""
    signed_weights: bool
    """Whether B is int8 with zero point 0 (the Gemv op's VNNI operand)."""
    c: np.ndarray
    """int64 [N]: QGemm's int32 C (0 where it has none)."""
    scale: np.ndarray
    """float32 [N]: the output scale, as QGemm forms it."""
    zp_a: int
    zp_y: int
    """y's zero point (0 for a float y)."""
    float_out: bool


def gemm_parts(node: onnx.NodeProto, inits: dict) -> GemmParts | None:
    """`node`'s parts where it is a QGemm with constant B (8-bit), scales, zero points and C and
    an untransposed A; None otherwise (conversion/pair_gemm.py shares this)."""
    if node.op_type != "QGemm" or node.domain != "com.microsoft" or len(node.input) < 6:
        return None
    names = list(node.input) + [""] * (9 - len(node.input))
    _, a_scale, a_zp, b_name, b_scale, b_zp, c_name, y_scale, y_zp = names
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("transA", 0) != 0:
        return None
    parts = [constant(inits, n) for n in (a_scale, a_zp, b_name, b_scale, b_zp)]
    if any(p is None for p in parts):
        return None
    a_scale_v, a_zp_v, b, b_scale_v, b_zp_v = parts
    a_type = inits[a_zp].data_type
    if a_type not in RANGE or b.dtype not in (np.int8, np.uint8) or b.ndim != 2:
        return None
    if a_scale_v.size != 1 or a_zp_v.size != 1:
        return None
    trans_b = attrs.get("transB", 0)
    weights = b.T if trans_b else b  # [K, N]
    k, n = weights.shape
    if b_scale_v.size not in (1, n) or b_zp_v.size not in (1, n):
        return None
    c = np.zeros(n, np.int64)
    if c_name:
        bias = constant(inits, c_name)
        if bias is None or bias.dtype != np.int32 or bias.size not in (1, n):
            return None
        c = np.broadcast_to(bias.reshape(-1).astype(np.int64), (n,)).copy()
    # QGemm requantizes where y has a zero point and a scale, and writes floats where it has
    # neither; one without the other is not a form ORT's optimizer writes: left to QGemm
    if bool(y_scale) != bool(y_zp):
        return None
    float_out = not y_scale
    zp_y = 0
    if not float_out:
        y_scale_v, y_zp_v = constant(inits, y_scale), constant(inits, y_zp)
        if y_scale_v is None or y_scale_v.size != 1 or y_zp_v is None or y_zp_v.size != 1:
            return None
        if inits[y_zp].data_type != a_type:
            return None
        zp_y = int(y_zp_v.reshape(-1)[0])
    # QGemm's output scale in float32, in its order: alpha * a_scale, times b_scale, over y_scale
    alpha = np.float32(attrs.get("alpha", 1.0))
    scale = (alpha * np.float32(a_scale_v.reshape(-1)[0])) * np.broadcast_to(
        b_scale_v.reshape(-1).astype(np.float32), (n,)
    )
    if not float_out:
        scale = scale / np.float32(y_scale_v.reshape(-1)[0])
    zero = np.broadcast_to(b_zp_v.reshape(-1).astype(np.int64), (n,))
    return GemmParts(
        a_type=a_type,
        weights=weights.astype(np.int64) - zero,
        signed_weights=b.dtype == np.int8 and not np.any(b_zp_v != 0),
        c=c,
        scale=scale.astype(np.float32),
        zp_a=int(a_zp_v.reshape(-1)[0]),
        zp_y=zp_y,
        float_out=float_out,
    )


def _plan(node: onnx.NodeProto, inits: dict) -> dict | None:
    """The Gemv inputs for `node`, or None where it is neither a QGemm nor a 1x1 QLinearConv
    that the op takes (see the module's doc)."""
    if node.op_type == "QLinearConv":
        return _conv_plan(node, inits)
    gemm = gemm_parts(node, inits)
    if gemm is None or not gemm.signed_weights:
        return None
    op = OPS[(gemm.a_type, gemm.float_out)]
    return _inputs(gemm.weights, gemm.c, gemm.a_type, gemm.zp_a, gemm.scale, gemm.zp_y, op)


def _conv_plan(node: onnx.NodeProto, inits: dict) -> dict | None:
    """The inputs for a channels-last 1x1 QLinearConv of stride 1, no pads and one group whose
    weights less their zero point are int8 values, or None."""
    conv = conv_parts(node, inits)
    weights = pointwise_weights(conv) if conv is not None else None
    if weights is None or weights.size == 0 or weights.min() < -128 or weights.max() > 127:
        return None
    op = OPS[(conv.x_type, False)]
    return _inputs(weights, conv.bias, conv.x_type, conv.zp_x, conv.scale, conv.zp_y, op)


def _inputs(
    w64: np.ndarray, c: np.ndarray, a_type: int, zp_a: int, scale: np.ndarray, zp_y: int, op: str
) -> dict | None:
    """replace_convs' inputs for [K, N] weights `w64` (int8 values), or None where a partial
    sum could leave int32."""
    k = w64.shape[0]
    # a's bytes as the op reads them: int8 shifted by 128, so its zero point shifts too
    zp = zp_a + (128 if a_type == TensorProto.INT8 else 0)
    corr = c - zp * w64.sum(axis=0)
    # every partial sum inside int32, as MLAS's accumulator: |corr| plus the widest products
    if int((np.abs(corr) + 255 * np.abs(w64).sum(axis=0)).max()) >= INT32:
        return None
    return {  # replace_convs' inputs: the op's corr in its "bias" slot
        "prefix": "gemv",
        "op": op,
        "weights": pack_weights(w64.astype(np.int8)),
        "bias": corr.astype(np.int32),
        "scale": scale.astype(np.float32),
        "geometry": np.array([k, zp_y, 0], np.int64),
    }

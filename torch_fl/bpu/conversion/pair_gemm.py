"""Pointwise convs and many-row GEMMs of ONNX Runtime's optimized sim graph as the extension's
exact PairGemm op, where the sim's integer kernels are ORT's u8u8 ones.

On an x86 CPU without VNNI, ORT's fast u8s8 kernels add int16 pairs that saturate, so the sim
runs every op whose input no Relu bounds on ORT's u8u8 kernels (runtime/sim_kernels.py: the
`mixed` path), and those were slower than ORT's own float kernels there: MobileNetV3-Small's
1x1 conv from 16 to 72 channels at 56x56 took 221 us as u8u8 against 97 us in float (ORT's
profiler, emulated AVX2, 1 thread: docs/compile-models.md). This pass replaces each
channels-last 1x1 QLinearConv (stride 1, no pads, one group), each QGemm and each
QLinearMatMul with constant weights by `torch_fl.bpu.PairGemm<U8|I8>[F]`
(csrc/runtime/ort_pair_gemm.cpp): the same int32 accumulator from AVX2's exact 16-bit products
(`vpmaddwd`), then the ORT op's own output step, so the result is ORT's byte for byte, or float
for float (tests/compile/test_pair_gemm.py).

Which ones: the executor asks for the pass only where its kernel path is `mixed` or `u8u8`, the
op has its AVX2 form (`torch_fl._C._pair_gemm_kernel()`) and the CPU has no AVX-512, whose u8u8
kernels in ORT are wider (runtime/executors.takes_pair_gemms); `u8u8_only` then keeps the ops
whose weights are int8 (the `mixed` path's u8s8 convs, exact and fast in ORT's own kernel) with
ORT. Every partial sum must stay inside int32, as ORT's accumulator does.

A GEMM of few rows with large weights also stays ORT's (`stays_short`): the op holds its weights
as int16 pairs, twice ORT's bytes, and where A has fewer rows than one of the op's tiles the call
is the weights' trip from memory. On a Zen 3 EPYC (one node, 1 thread, `scripts/bench_conv_ops`'s
timing, by hand) ORT's u8u8 QGemm over 1024 x 1000 weights (MobileNetV3-Small's classifier) took
0.93 and 1.02 of the op's time at 1 and 2 rows and 0.67 to 0.83 at 4 to 48 rows, where over
384 x 1152 the op won at up to 12 rows (1.05 to 1.16) and over 96 x 576 at every count (1.19 to
1.27); the classifier's two GEMMs left to ORT made MobileNetV3-Small's session at batch 1 1.02x
as fast. Rows are read from the integer graph's shapes (`gemv.gemm_rows`); a 1x1 conv, whose
pixel count ORT's layout pass renames away from the shapes, always moves.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from torch_fl.bpu.conversion.depthwise import replace_convs
from torch_fl.bpu.conversion.gemv import INT32, gemm_parts
from torch_fl.bpu.conversion.qlinear_conv import (
    constant,
    conv_parts,
    integer_conv_weights,
    pointwise_weights,
)

__all__ = [
    "LARGE_WEIGHTS",
    "OPS",
    "SHORT_ROWS",
    "candidates",
    "pack_pairs",
    "rewrite_pair_gemm",
    "stays_short",
]

OPS = {
    (TensorProto.UINT8, False): "PairGemmU8",
    (TensorProto.UINT8, True): "PairGemmU8F",
    (TensorProto.INT8, False): "PairGemmI8",
    (TensorProto.INT8, True): "PairGemmI8F",
}
"""The op for x's 8-bit type and whether y is float."""
_X_SHIFT = {TensorProto.UINT8: 0, TensorProto.INT8: 128}
"""What the op adds to x's values as it widens them (int8 read as x + 128: ort_pair_gemm.cpp)."""
SHORT_ROWS = 48
"""A GEMM with fewer rows than this (the op's tile, `kTileRows` in ort_pair_gemm.cpp) ..."""
LARGE_WEIGHTS = 1 << 20
"""... and more int16 weight bytes than this stays ORT's (see above)."""


def candidates(model: onnx.ModelProto) -> int:
    """How many 1x1 Convs and Gemms (or their ORT-fused forms) the integer graph `model`
    (before ORT's optimizer) has: `rewrite_pair_gemm` decides each on ORT's graph."""
    gemms = sum(n.op_type in ("Gemm", "QGemm", "MatMul", "QLinearMatMul") for n in model.graph.node)
    convs = integer_conv_weights(model)
    return gemms + sum(
        dims is not None and len(dims) == 4 and dims[2:] == [1, 1] for _, dims in convs
    )


def pack_pairs(w: np.ndarray) -> np.ndarray:
    """Weights as [K, N] integers (less their zero point) -> the op's [N16 / 16, K2, 16, 2]
    int16 layout, padded with zeros."""
    k, n = w.shape
    k2, n16 = -(-k // 2) * 2, -(-n // 16) * 16
    padded = np.zeros((k2, n16), np.int16)
    padded[:k, :n] = w
    return np.ascontiguousarray(padded.reshape(k2 // 2, 2, n16 // 16, 16).transpose(2, 0, 3, 1))


def rewrite_pair_gemm(
    model: onnx.ModelProto,
    u8u8_only: bool = True,
    form: int = 0,
    rows: dict[str, int] | None = None,
) -> int:
    """Replace, in place, each qualifying channels-last 1x1 QLinearConv, QGemm and
    QLinearMatMul of ORT's optimized `model` with a PairGemm op; returns how many. With
    `u8u8_only`, only those whose weights are uint8 (ORT's u8u8 kernels) qualify. `rows`: A's
    row count of named Gemms (`gemv.gemm_rows` of the integer graph); a QGemm `stays_short`
    stays ORT's. `form` 1 asks the op for its plain loop (tests compare the forms)."""
    known = rows or {}
    return replace_convs(model, lambda node, inits: _plan(node, inits, u8u8_only, known), form)


def stays_short(rows: int | None, k: int, n: int) -> bool:
    """Whether a GEMM of `rows` rows (None: unknown) over [k, n] weights stays ORT's: fewer rows
    than `SHORT_ROWS` and more int16 weight bytes, as the op packs them, than `LARGE_WEIGHTS`."""
    packed = 2 * (-(-k // 2) * 2) * (-(-n // 16) * 16)
    return rows is not None and rows < SHORT_ROWS and packed > LARGE_WEIGHTS


def _plan(node: onnx.NodeProto, inits: dict, u8u8_only: bool, rows: dict) -> dict | None:
    if node.op_type == "QLinearConv":
        weights_name = node.input[3] if len(node.input) > 3 else ""
        return _conv_plan(node, inits) if _takes(inits, weights_name, u8u8_only) else None
    if node.op_type == "QGemm":
        weights_name = node.input[3] if len(node.input) > 3 else ""
        if not _takes(inits, weights_name, u8u8_only):
            return None
        plan = _gemm_plan(node, inits)
        if plan is not None and stays_short(rows.get(node.name), *_kn(plan)):
            return None
        return plan
    if node.op_type == "QLinearMatMul" and node.domain in ("", "ai.onnx"):
        weights_name = node.input[3] if len(node.input) == 8 else ""
        return _matmul_plan(node, inits) if _takes(inits, weights_name, u8u8_only) else None
    return None


def _kn(plan: dict) -> tuple[int, int]:
    """K and N of a planned op, from its geometry and its corr (one per output column)."""
    return int(plan["geometry"][0]), int(plan["bias"].shape[0])


def _takes(inits: dict, weights_name: str, u8u8_only: bool) -> bool:
    init = inits.get(weights_name)
    if init is None:
        return False
    return not u8u8_only or init.data_type == TensorProto.UINT8


def _conv_plan(node: onnx.NodeProto, inits: dict) -> dict | None:
    """The op's inputs for a channels-last 1x1 QLinearConv of stride 1, no pads and one group
    (a GEMM over its pixels), or None."""
    conv = conv_parts(node, inits)
    weights = pointwise_weights(conv) if conv is not None else None
    if weights is None:
        return None
    zp = conv.zp_x + _X_SHIFT[conv.x_type]
    return _inputs(weights, conv.bias, zp, conv.scale, conv.zp_y, OPS[(conv.x_type, False)])


def _gemm_plan(node: onnx.NodeProto, inits: dict) -> dict | None:
    """The op's inputs for a QGemm with constant B, scales, zero points and C, or None."""
    gemm = gemm_parts(node, inits)
    if gemm is None:
        return None
    zp = gemm.zp_a + _X_SHIFT[gemm.a_type]
    op = OPS[(gemm.a_type, gemm.float_out)]
    return _inputs(gemm.weights, gemm.c, zp, gemm.scale, gemm.zp_y, op)


def _matmul_plan(node: onnx.NodeProto, inits: dict) -> dict | None:
    """The op's inputs for a QLinearMatMul whose B is a constant 2-D matrix and whose scales and
    zero points are constants (per-tensor x and y, per-tensor or per-column B), or None."""
    consts = [constant(inits, name) for name in node.input[1:]]
    if any(c is None for c in consts):
        return None
    a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = consts
    x_type = inits[node.input[2]].data_type
    if x_type not in _X_SHIFT or inits[node.input[7]].data_type != x_type:
        return None
    if b.ndim != 2 or b.dtype not in (np.int8, np.uint8):
        return None
    n = b.shape[1]
    if a_scale.size != 1 or a_zp.size != 1 or y_scale.size != 1 or y_zp.size != 1:
        return None
    if b_scale.size not in (1, n) or b_zp.size not in (1, n):
        return None
    weights = b.astype(np.int64) - np.broadcast_to(b_zp.reshape(-1).astype(np.int64), (n,))
    # QLinearMatMul's output scale in float32: a_scale times b_scale, over y_scale (the tests hold
    # the op's bytes to ORT's over random per-column scales)
    product = np.float32(a_scale.reshape(-1)[0]) * np.broadcast_to(
        b_scale.reshape(-1).astype(np.float32), (n,)
    )
    scale = product / np.float32(y_scale.reshape(-1)[0])
    zp = int(a_zp.reshape(-1)[0]) + _X_SHIFT[x_type]
    op = OPS[(x_type, False)]
    return _inputs(weights, np.zeros(n, np.int64), zp, scale, int(y_zp.reshape(-1)[0]), op)


def _inputs(
    weights: np.ndarray, bias: np.ndarray, zp: int, scale: np.ndarray, zp_y: int, op: str
) -> dict | None:
    """replace_convs' inputs (the op's corr in its "bias" slot), or None where a partial sum
    could leave int32 or a weight int16."""
    w64 = weights.astype(np.int64)
    if w64.size == 0 or np.abs(w64).max() > 255:
        return None
    corr = bias.astype(np.int64) - zp * w64.sum(axis=0)
    # every partial sum inside int32, as ORT's accumulator: |corr| plus the widest products
    if int((np.abs(corr) + 255 * np.abs(w64).sum(axis=0)).max()) >= INT32:
        return None
    return {
        "prefix": "pair",
        "op": op,
        "weights": pack_pairs(w64),
        "bias": corr.astype(np.int32),
        "scale": np.asarray(scale, np.float32).reshape(-1),
        "geometry": np.array([weights.shape[0], zp_y, 0], np.int64),
    }

"""Two-input byte tables that are a product of two one-input float tables.

A squeeze-excitation scale is `Q(f(a) * g(b))`: `f` the block's activation of the feature map
(hardswish, SiLU), `g` the gate of the channel's squeeze (hard-sigmoid, sigmoid), `Q` the
quantize after them. conversion/lookups.py makes such a chain one `Lookup2U8` / `I8` over a
table of 65536 bytes; over NHWC pixels each output is then a gather from that table with a
different row per channel, 0.35 to 1 ns an output here (csrc/runtime/ort_lookup.cpp). Where the
table is exactly `Q(f[a] * g[b])` for two tables of 256 floats, the op can look `f` up in
registers (AVX512-VBMI), multiply by the channel's `g` and quantize: `Lookup2MulU8` / `I8`,
the same table plus `f`, `g` and the quantization, which it uses where the broadcast is a
per-channel one over NHWC rows and the CPU has AVX512-VBMI (the table runs it elsewhere).

Exactness is checked, not assumed: `fit` takes the Mul's two inputs as ONNX Runtime computed
them for every pair (each must depend on one input only), forms every product and its
quantization in the kernel's own float32 arithmetic (a multiply, then a divide by the scale,
or a multiply by its reciprocal: whichever reproduces the table), and returns the form only
where all 65536 results equal the table's bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Product", "fit"]


@dataclass(frozen=True)
class Product:
    a_floats: np.ndarray
    """[256] float32: the Mul's factor for each byte of the first input."""
    b_floats: np.ndarray
    """[256] float32: the factor for each byte of the second input."""
    quant: np.ndarray
    """[3] float32: the scale (or its reciprocal), the zero point, 1 to divide by the scale or
    0 to multiply by it (the op's last input)."""


def _depends_on_first_only(values: np.ndarray) -> bool:
    """Whether [256, 256] `values` (first input by row) are the same across each row."""
    bits = values.view(np.uint32)
    return bool((bits == bits[:, :1]).all())


def fit(
    first: np.ndarray,
    second: np.ndarray,
    table: np.ndarray,
    scale: float,
    zero_point: int,
    signed: bool,
) -> Product | None:
    """The product form of `table` (65536 bytes, index `a * 256 + b`), or None.

    `first` and `second`: the final Mul's two float inputs for every pair, in table order;
    `scale` and `zero_point` the QuantizeLinear's after it; `signed`: int8 output (else
    uint8)."""
    if first.size != 65536 or second.size != 65536 or table.size != 65536:
        return None
    m0 = np.asarray(first, np.float32).reshape(256, 256)
    m1 = np.asarray(second, np.float32).reshape(256, 256)
    for x, y in ((m0, m1), (m1, m0)):
        if _depends_on_first_only(x) and _depends_on_first_only(np.ascontiguousarray(y.T)):
            a_floats, b_floats = x[:, 0].copy(), y[0, :].copy()
            break
    else:
        return None
    if not (np.isfinite(a_floats).all() and np.isfinite(b_floats).all()):
        return None
    lo, hi = (-128, 127) if signed else (0, 255)
    want = np.asarray(table).reshape(256, 256).view(np.int8 if signed else np.uint8)
    product = a_floats[:, None] * b_floats[None, :]  # float32 x float32: one rounding
    s = np.float32(scale)
    for divide in (True, False):
        factor = s if divide else np.float32(1) / s
        with np.errstate(over="ignore"):
            scaled = product / factor if divide else product * factor
        clamped = np.clip(scaled, np.float32(lo - zero_point), np.float32(hi - zero_point))
        got = np.rint(clamped).astype(np.int32) + zero_point
        if np.array_equal(got, want.astype(np.int32)):
            quant = np.array([factor, zero_point, 1.0 if divide else 0.0], np.float32)
            return Product(a_floats, b_floats, quant)
    return None

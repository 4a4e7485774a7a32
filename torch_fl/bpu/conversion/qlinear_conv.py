"""The parts of a channels-last QLinearConv in ONNX Runtime's optimized sim graph, for the passes
that move some of them to the extension's own conv ops (conversion/depthwise.py,
conversion/narrow_op.py).

ORT's optimizer writes each fused DQ -> Conv -> Q of an integer graph as a `com.microsoft`
QLinearConv with `channels_last=1`. Both ops take its integers and its requantization scale as
ORT forms it: `x_scale * w_scale / y_scale`, each step a float32 operation in that order (ORT's
QLinearConv computes it so, and the ops' tests pin the order with scales whose other order
rounds differently).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "RANGE", "ConvParts", "constant", "conv_parts", "drop_unread", "integer_conv_weights",
    "pointwise_weights",
]  # fmt: skip

RANGE = {TensorProto.UINT8: (0, 255), TensorProto.INT8: (-128, 127)}
"""The values of each 8-bit activation type."""


@dataclass(frozen=True)
class ConvParts:
    x_type: int
    """TensorProto.UINT8 or INT8: x's and y's type."""
    taps: np.ndarray
    """int64 [CO, CI / group, KH, KW]: the weights less their zero point."""
    bias: np.ndarray
    """int64 [CO]: QLinearConv's int32 bias (0 where it has none)."""
    scale: np.ndarray
    """float32 [CO]: the requantization scale, as ORT forms it."""
    zp_x: int
    zp_y: int
    group: int
    strides: tuple[int, int]
    dilations: tuple[int, int]
    pads: tuple[int, int, int, int]
    """top, left, bottom, right (ONNX's begins, then ends)."""

    @property
    def kernel(self) -> tuple[int, int]:
        return int(self.taps.shape[2]), int(self.taps.shape[3])

    def geometry(self) -> list[int]:
        """KH, KW, strides, pads (top, left, bottom, right), dilations, zero points of x and y:
        the leading values of both ops' geometry input."""
        return [*self.kernel, *self.strides, *self.pads, *self.dilations, self.zp_x, self.zp_y]


def conv_parts(node: onnx.NodeProto, inits: dict) -> ConvParts | None:
    """`node`'s parts where it is a channels-last 2-D QLinearConv with constant weights, scales,
    zero points and bias, per-tensor x and y quantization and explicit pads; None otherwise."""
    if node.op_type != "QLinearConv" or node.domain != "com.microsoft":
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("channels_last", 0) != 1 or attrs.get("auto_pad", b"NOTSET") not in (
        b"NOTSET",
        "NOTSET",
    ):
        return None
    consts = [constant(inits, name) for name in node.input[1:]]
    if len(node.input) not in (8, 9) or any(c is None for c in consts):
        return None
    x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp = consts[:7]
    if w.ndim != 4:
        return None
    outputs = w.shape[0]
    bias = consts[7] if len(consts) > 7 else np.zeros(outputs, np.int32)
    x_type = inits[node.input[2]].data_type
    if x_type not in RANGE or y_zp.dtype != x_zp.dtype or x_scale.size != 1 or y_scale.size != 1:
        return None
    if x_zp.size != 1 or y_zp.size != 1 or w_scale.size not in (1, outputs):
        return None
    if w_zp.size not in (1, outputs) or bias.shape != (outputs,):
        return None
    if list(attrs.get("kernel_shape", w.shape[2:])) != list(w.shape[2:]):
        return None
    strides = list(attrs.get("strides", [1, 1]))
    dilations = list(attrs.get("dilations", [1, 1]))
    pads = list(attrs.get("pads", [0, 0, 0, 0]))
    if len(strides) != 2 or len(dilations) != 2 or len(pads) != 4:
        return None
    taps = w.astype(np.int64) - w_zp.astype(np.int64).reshape(-1, 1, 1, 1)
    # ORT's requantization scale, each step a float32 operation in its order: x * w / y
    scale = (np.float32(x_scale.reshape(())) * w_scale.astype(np.float32).reshape(-1)) / np.float32(
        y_scale.reshape(())
    )
    return ConvParts(
        x_type=x_type,
        taps=taps,
        bias=bias.astype(np.int64),
        scale=np.broadcast_to(scale.astype(np.float32), (outputs,)).copy(),
        zp_x=int(x_zp.reshape(())),
        zp_y=int(y_zp.reshape(())),
        group=int(attrs.get("group", 1)),
        strides=(int(strides[0]), int(strides[1])),
        dilations=(int(dilations[0]), int(dilations[1])),
        pads=(int(pads[0]), int(pads[1]), int(pads[2]), int(pads[3])),
    )


def pointwise_weights(conv: ConvParts) -> np.ndarray | None:
    """[K, N] int64 weights (less their zero point) where `conv` is a 1x1 conv of stride 1, no
    pads and one group, a GEMM over its pixels (conversion/gemv.py, pair_gemm.py); else None."""
    if conv.group != 1 or conv.kernel != (1, 1) or conv.strides != (1, 1) or any(conv.pads):
        return None
    return conv.taps[:, :, 0, 0].T


def constant(inits: dict, name: str) -> np.ndarray | None:
    """The initializer `name` of `inits` as an array; None where it is not one (or the name is
    empty: an omitted optional input)."""
    init = inits.get(name) if name else None
    return None if init is None else numpy_helper.to_array(init)


def integer_conv_weights(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, list[int] | None]]:
    """Each Conv and QLinearConv of the integer graph `model` (before ORT's optimizer) with its
    weights' dims, read through a DequantizeLinear before them (None where not a constant): the
    candidate counts of conversion/narrow_op.py and pair_gemm.py."""
    shapes = {i.name: list(i.dims) for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    convs = []
    for node in model.graph.node:
        if node.op_type not in ("Conv", "QLinearConv"):
            continue
        name = node.input[1] if node.op_type == "Conv" else node.input[3]
        dq = producer.get(name)
        if dq is not None and dq.op_type == "DequantizeLinear":
            name = dq.input[0]
        convs.append((node, shapes.get(name)))
    return convs


def drop_unread(model: onnx.ModelProto) -> None:
    """Drop the initializers no node reads any more (the replaced convs' int8 weights)."""
    read = {name for node in model.graph.node for name in node.input}
    # graph inputs too: an initializer listed as an input is its default, which must stay
    read |= {o.name for o in model.graph.output} | {i.name for i in model.graph.input}
    keep = [i for i in model.graph.initializer if i.name in read]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)

"""8-bit max pools that ONNX Runtime leaves channels-first, in its optimized sim graph, as the
extension's own op.

ONNX Runtime pools an 8-bit tensor fast only channels-last: its layout pass turns a MaxPool
between channels-last convs into NhwcMaxPool. A pool whose neighbours are not such convs stays
a plain MaxPool over NCHW bytes and runs ORT's generic per-element loop. DenseNet-121's stem
pool feeds a concat and a float batch norm: 4852 us of its 35.3 ms session at batch 1 on 1
thread (ORT's profiler, AVX512-VNNI EPYC), where ORT's own int8 model pools the same tensor
channels-last in 72 us. This pass replaces each such MaxPool with `torch_fl.bpu.MaxPoolU8` /
`I8` (csrc/runtime/ort_maxpool.cpp): per output row, the max of the window's input rows, then of
its columns, over contiguous bytes. A max of integers has one answer, so the op equals ORT's
MaxPool byte for byte (tests/compile/test_max_pool.py holds them equal over kernels, strides,
dilations, pads and both byte types).

Only 2-D pools of one output (no indices), explicit pads (`auto_pad` NOTSET) and floor sizes
(`ceil_mode` 0) move; any other MaxPool stays ORT's.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from torch_fl.bpu.conversion.export import attribute, splice
from torch_fl.bpu.conversion.lookups import DOMAIN, import_domain
from torch_fl.bpu.conversion.qlinear_conv import drop_unread

__all__ = ["OPS", "byte_type", "candidates", "rewrite_max_pools"]

OPS = {TensorProto.UINT8: "MaxPoolU8", TensorProto.INT8: "MaxPoolI8"}
_SAME_BYTES = ("MaxPool", "NhwcMaxPool", "Transpose", "Reshape", "Flatten", "Squeeze",
               "Unsqueeze", "Identity", "Concat", "Slice", "Split", "Pad")  # fmt: skip
"""Ops whose outputs have their first input's element type."""
_OUTPUT_ZERO_POINT = {"QuantizeLinear": 2, "QLinearConv": 7, "QLinearAdd": 7, "QLinearMul": 7,
                      "QLinearConcat": 1, "QLinearAveragePool": 4,
                      "QLinearGlobalAveragePool": 4}  # fmt: skip
"""Where each quantizing op of ORT's graph reads its output's zero point (its type is the
output's)."""


def candidates(model: onnx.ModelProto) -> int:
    """How many MaxPool nodes the integer graph `model` (before ORT's optimizer) has;
    `rewrite_max_pools` decides each on ORT's optimized graph."""
    return sum(node.op_type == "MaxPool" for node in model.graph.node)


def rewrite_max_pools(model: onnx.ModelProto, form: int = 0) -> int:
    """Replace, in place, each channels-first 2-D MaxPool of a byte tensor in ORT's optimized
    `model` with a MaxPool op of the extension; returns how many. `form` 1 asks the op for its
    plain loop (tests compare the forms)."""
    inits = {i.name: i for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    inputs = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    added: list[onnx.TensorProto] = []
    replaced: dict[int, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        geometry = _geometry(node)
        if geometry is None:
            continue
        kind = byte_type(node.input[0], producer, readers, inits, inputs)
        if kind is None:
            continue
        # named by its output, which no other node writes (node names may repeat or be empty)
        prefix = f"max_pool::{node.output[0]}"
        added.append(numpy_helper.from_array(np.array([*geometry, form], np.int64), prefix))
        replaced[id(node)] = [
            helper.make_node(
                OPS[kind], [node.input[0], prefix], [node.output[0]], name=prefix, domain=DOMAIN
            )
        ]
    if replaced:
        splice(model, replaced)
        model.graph.initializer.extend(added)
        drop_unread(model)
        import_domain(model)
    return len(replaced)


def _geometry(node: onnx.NodeProto) -> list[int] | None:
    """[KH, KW, stride h, w, pads top, left, bottom, right, dilation h, w] of a plain 2-D
    MaxPool that the op computes alike, else None."""
    if node.op_type != "MaxPool" or node.domain not in ("", "ai.onnx"):
        return None
    if len(node.output) > 1 and node.output[1]:
        return None  # the indices output: the op has none
    if attribute(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    if attribute(node, "ceil_mode", 0) != 0:
        return None
    kernel = list(attribute(node, "kernel_shape", []))
    if len(kernel) != 2:
        return None
    strides = list(attribute(node, "strides", [1, 1]))
    pads = list(attribute(node, "pads", [0, 0, 0, 0]))
    dilations = list(attribute(node, "dilations", [1, 1]))
    if len(strides) != 2 or len(pads) != 4 or len(dilations) != 2:
        return None
    return [*kernel, *strides, pads[0], pads[1], pads[2], pads[3], *dilations]


def byte_type(
    name: str,
    producer: dict[str, onnx.NodeProto],
    readers: dict[str, list[onnx.NodeProto]],
    inits: dict[str, onnx.TensorProto],
    inputs: dict[str, int],
) -> int | None:
    """TensorProto.UINT8 or INT8 where tensor `name` of ORT's optimized graph is known to be
    that 8-bit type (by what writes it, through ops that keep their input's type, or by a
    DequantizeLinear that reads it), else None: a tensor of unknown type stays ORT's."""
    seen = name
    while True:
        node = producer.get(seen)
        if node is None:
            kind = inputs.get(seen)
            break
        if node.domain == DOMAIN:
            kind = (
                TensorProto.UINT8
                if node.op_type.endswith("U8")
                else TensorProto.INT8
                if node.op_type.endswith("I8")
                else None
            )
            break
        if node.op_type in _SAME_BYTES and node.input:
            seen = node.input[0]
            continue
        slot = _OUTPUT_ZERO_POINT.get(node.op_type)
        kind = _zero_point_type(node, slot, inits) if slot is not None else None
        break
    if kind in OPS:
        return kind
    for reader in readers.get(name, []):
        if reader.op_type == "DequantizeLinear" and reader.input[0] == name:
            kind = _zero_point_type(reader, 2, inits)
            if kind in OPS:
                return kind
    return None


def _zero_point_type(node: onnx.NodeProto, slot: int, inits: dict) -> int | None:
    """The element type of `node`'s zero point input `slot` (an initializer), else None; a
    QuantizeLinear without one writes uint8."""
    if len(node.input) <= slot or not node.input[slot]:
        return TensorProto.UINT8 if node.op_type == "QuantizeLinear" else None
    init = inits.get(node.input[slot])
    return init.data_type if init is not None else None

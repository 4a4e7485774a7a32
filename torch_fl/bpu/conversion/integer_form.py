"""The Q/DQ graph in the form ONNX Runtime's fused integer kernels take, with the same numbers.

The reference graph (conversion/qdq.py) quantizes activations to int8 with zero point 0 and
weights to int8, every DQ -> Conv/Gemm/MatMul -> Q group meant for the BPU. ORT fuses such
groups into QLinearConv / QGemm / QLinearMatMul (int32 accumulation, one requantization), but
which integer types it can use exactly depends on the CPU (runtime/sim_kernels.py). This module
rewrites the graph for a kernel path without changing a represented value:

- `u8s8`: activations move to uint8 with zero point 128 (q + 128: the same real values, the same
  clipping at -128..127), weights stay int8. The fastest kernels on CPUs with VNNI.
- `u8u8`: weights move to uint8 with zero point 128 too, for CPUs whose u8s8 kernels add pairs
  of products in saturating int16 (AVX2 without VNNI); the u8u8 kernels widen first.

And in both, a Relu or constant-bound Clip between an op and the quantization of its result
(op -> Relu -> Q) moves after the quantization as max(q, zero point), or a Clip of the quantized
values to Q(lo)..Q(hi): quantization is monotone, so it commutes with either exactly, and the op
then ends in a Q that ORT can fuse.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from torch_fl.bpu.conversion.export import constant_names, constant_value

PATHS = ("u8s8", "u8u8")
SHIFT = 128


def _scalar_int8(init: onnx.TensorProto | None) -> bool:
    return init is not None and init.data_type == onnx.TensorProto.INT8 and not init.dims


class _Rewriter:
    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        graph = model.graph
        self.inits = {i.name: i for i in graph.initializer}
        self.producer = {o: n for n in graph.node for o in n.output}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                self.readers.setdefault(name, []).append(node)
        self.new_inits: dict[str, onnx.TensorProto] = {}
        self.constants = constant_names(model)

    def _u8(self, name: str, array: np.ndarray) -> str:
        if name not in self.new_inits:
            self.new_inits[name] = numpy_helper.from_array(array, name)
        return name

    def shift_activations(self) -> None:
        """Every activation Q/DQ with a scalar int8 zero point: uint8, zero point 128."""
        zp128 = self._u8("int8form::zp_u8_128", np.array(SHIFT, np.uint8))
        for node in self.model.graph.node:
            if node.op_type not in ("QuantizeLinear", "DequantizeLinear") or len(node.input) < 3:
                continue
            if node.op_type == "DequantizeLinear" and node.input[0] in self.inits:
                continue  # a weight or bias (constant) tensor
            zp = self.inits.get(node.input[2])
            if _scalar_int8(zp) and int(numpy_helper.to_array(zp)) == 0:
                node.input[2] = zp128

    def shift_weights(self) -> None:
        """Every int8 weight initializer read by a DequantizeLinear: uint8 w + 128."""
        for node in self.model.graph.node:
            if node.op_type != "DequantizeLinear" or node.input[0] not in self.inits:
                continue
            weight = self.inits[node.input[0]]
            if weight.data_type != onnx.TensorProto.INT8 or len(node.input) < 3:
                continue
            zp = numpy_helper.to_array(self.inits[node.input[2]])
            if np.any(zp != 0):
                continue
            values = numpy_helper.to_array(weight).astype(np.int16) + SHIFT
            node.input[0] = self._u8(f"{node.input[0]}::u8", values.astype(np.uint8))
            shifted_zp = np.full(zp.shape, SHIFT, np.uint8)
            node.input[2] = self._u8(f"{node.input[2]}::u8", shifted_zp)

    def _quantized_bound(self, q: onnx.NodeProto, bound: str, suffix: str) -> str:
        """The constant `bound` quantized as `q` quantizes (round half to even, saturate)."""
        if not bound:
            return ""
        scale = float(numpy_helper.to_array(self.inits[q.input[1]]))
        zp_init = self.inits.get(q.input[2])
        zp = numpy_helper.to_array(zp_init if zp_init is not None else self.new_inits[q.input[2]])
        info = np.iinfo(zp.dtype)
        value = float(constant_value(self.model, bound))
        quantized = np.clip(np.rint(value / scale) + int(zp), info.min, info.max)
        return self._u8(f"{q.output[0]}::{suffix}", np.array(quantized, zp.dtype))

    def clamp_after_quantize(self) -> int:
        """op -> Relu|Clip -> Q(s, z) -> ...  becomes  op -> Q(s, z) -> Max(q, z) -> ... (Relu)
        or  op -> Q(s, z) -> Clip(q, Q(lo), Q(hi)) -> ... (Clip with constant bounds).

        Any op: a weight op then ends in its Q (QLinearConv...), an Add of two dequantized
        tensors in one (QLinearAdd)."""
        moved = 0
        graph = self.model.graph
        order = list(graph.node)
        for clamp in order:
            if clamp.op_type not in ("Relu", "Clip"):
                continue
            bounds = list(clamp.input[1:]) if clamp.op_type == "Clip" else []
            if any(b and b not in self.constants for b in bounds):
                continue
            users = self.readers.get(clamp.output[0], [])
            if clamp.input[0] not in self.producer or len(users) != 1:
                continue
            q = users[0]
            if q.op_type != "QuantizeLinear" or len(self.readers.get(clamp.input[0], [])) != 1:
                continue
            if q.input[1] not in self.inits or len(q.input) < 3:
                continue
            # Q reads the op's output directly; the clamp acts on the quantized values
            q.input[0] = clamp.input[0]
            clipped = q.output[0]
            raw = f"{clipped}::before_clamp"
            q.output[0] = raw
            if clamp.op_type == "Relu":
                inputs = [raw, q.input[2]]
                clamp.op_type = "Max"
            else:
                low = self._quantized_bound(q, bounds[0] if bounds else "", "clip_lo")
                high = self._quantized_bound(q, bounds[1] if len(bounds) > 1 else "", "clip_hi")
                inputs = [raw, low, high]
            del clamp.input[:]
            clamp.input.extend(inputs)
            del clamp.output[:]
            clamp.output.append(clipped)
            clamp.name = f"{clamp.name or clipped}::clamp_int"
            moved += 1
        # the clamp now follows its Q: restore topological order
        if moved:
            nodes = _topological(order)
            del graph.node[:]
            graph.node.extend(nodes)
        return moved

    def finish(self) -> onnx.ModelProto:
        graph = self.model.graph
        used = {n for node in graph.node for n in node.input}
        kept = [i for i in graph.initializer if i.name in used]
        kept += [i for n, i in self.new_inits.items() if n in used]
        del graph.initializer[:]
        graph.initializer.extend(kept)
        return self.model


def _topological(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    produced_by = {o: i for i, n in enumerate(nodes) for o in n.output}
    done: set[int] = set()
    out: list[onnx.NodeProto] = []

    def visit(i: int) -> None:
        stack = [(i, False)]
        while stack:
            j, expanded = stack.pop()
            if j in done:
                continue
            if expanded:
                done.add(j)
                out.append(nodes[j])
                continue
            stack.append((j, True))
            for name in nodes[j].input:
                k = produced_by.get(name)
                if k is not None and k not in done:
                    stack.append((k, False))

    for i in range(len(nodes)):
        visit(i)
    return out


def to_integer_form(model: onnx.ModelProto, path: str) -> onnx.ModelProto:
    """A copy of the Q/DQ `model` rewritten for kernel path `path` ("u8s8" or "u8u8")."""
    if path not in PATHS:
        raise ValueError(f"kernel path must be one of {PATHS}, not {path!r}")
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    rewriter = _Rewriter(copy)
    rewriter.shift_activations()
    if path == "u8u8":
        rewriter.shift_weights()
    rewriter.clamp_after_quantize()  # after the shift: the clamp compares with the new zero point
    return rewriter.finish()

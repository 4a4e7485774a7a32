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

And in both, a Relu between an op and the quantization of its result (op -> Relu -> Q) moves
after the quantization as max(q, zero point): quantizing with zero point z commutes with relu
exactly, and the op then ends in a Q that ORT can fuse.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

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

    def relu_after_quantize(self) -> int:
        """op -> Relu -> Q(s, z) -> ...  becomes  op -> Q(s, z) -> Max(q, z) -> ...

        Any op: a weight op then ends in its Q (QLinearConv...), an Add of two dequantized
        tensors in one (QLinearAdd)."""
        moved = 0
        graph = self.model.graph
        order = list(graph.node)
        for relu in order:
            if relu.op_type != "Relu":
                continue
            users = self.readers.get(relu.output[0], [])
            if relu.input[0] not in self.producer or len(users) != 1:
                continue
            q = users[0]
            if q.op_type != "QuantizeLinear" or len(self.readers.get(relu.input[0], [])) != 1:
                continue
            # Q reads the op's output directly; a Max on the quantized values replaces the Relu
            q.input[0] = relu.input[0]
            clipped = q.output[0]
            raw = f"{clipped}::before_relu"
            q.output[0] = raw
            del relu.input[:]
            relu.input.extend([raw, q.input[2]])
            del relu.output[:]
            relu.output.append(clipped)
            relu.op_type = "Max"
            relu.name = f"{relu.name or clipped}::relu_int"
            moved += 1
        # the Max now follows its Q: restore topological order
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
    rewriter.relu_after_quantize()  # after the shift: the Max compares with the new zero point
    return rewriter.finish()

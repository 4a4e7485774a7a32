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
- `mixed`: for the same CPUs, a tensor that a Relu (or a Clip from 0 up) leaves non-negative is
  held as uint8 with zero point 0 instead: its values 0..127 times int8 weights (|w| <= 128) add
  in pairs to at most 2 x 127 x 128 = 32512, so the faster u8s8 kernels cannot saturate on it
  and the ops reading it keep int8 weights; every other weight op takes the u8u8 form.

And in every path, a Relu or constant-bound Clip between an op and the quantization of its result
(op -> Relu -> Q) moves after the quantization as max(q, zero point), or a Clip of the quantized
values to Q(lo)..Q(hi): quantization is monotone, so it commutes with either exactly, and the op
then ends in a Q that ORT can fuse; and the exporter's five-node erf GELU becomes one Gelu
(`fuse_gelu`), which ORT's QDQ pass would otherwise keep from fusing; and a quantized
ReduceMean over the spatial axes becomes GlobalAveragePool (`pool_means`), which ORT runs as
an integer kernel.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from torch_fl.bpu.conversion.export import constant_names, constant_value

PATHS = ("u8s8", "u8u8", "mixed")
SHIFT = 128
INT8_MAX = 127
SHIFTED_ZP = "int8form::zp_u8_128"  # the zero point of every int8 activation moved to uint8


def _scalar_int8(init: onnx.TensorProto | None) -> bool:
    return init is not None and init.data_type == onnx.TensorProto.INT8 and not init.dims


class _Rewriter:
    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        graph = model.graph
        self.inits = {i.name: i for i in graph.initializer}
        self._index()
        self.new_inits: dict[str, onnx.TensorProto] = {}
        self.constants = constant_names(model)

    def _index(self) -> None:
        """Who produces and who reads each tensor (again after nodes are re-added: protobuf's
        extend copies them)."""
        graph = self.model.graph
        self.producer = {o: n for n in graph.node for o in n.output}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                self.readers.setdefault(name, []).append(node)

    def _u8(self, name: str, array: np.ndarray) -> str:
        if name not in self.new_inits:
            self.new_inits[name] = numpy_helper.from_array(array, name)
        return name

    def shift_activations(self) -> None:
        """Every activation Q/DQ with a scalar int8 zero point: uint8, zero point 128."""
        zp128 = self._u8(SHIFTED_ZP, np.array(SHIFT, np.uint8))
        for node in self.model.graph.node:
            if node.op_type not in ("QuantizeLinear", "DequantizeLinear") or len(node.input) < 3:
                continue
            if node.op_type == "DequantizeLinear" and node.input[0] in self.inits:
                continue  # a weight or bias (constant) tensor
            zp = self.inits.get(node.input[2])
            if _scalar_int8(zp) and int(numpy_helper.to_array(zp)) == 0:
                node.input[2] = zp128

    def shift_weights(self, keep_int8: set[str] = frozenset()) -> None:
        """Every int8 weight initializer read by a DequantizeLinear: uint8 w + 128 (but for the
        dequantized weights named in `keep_int8`)."""
        for node in self.model.graph.node:
            if node.op_type != "DequantizeLinear" or node.input[0] not in self.inits:
                continue
            if node.output[0] in keep_int8:
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
        self.clamped: list[str] = []
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
            if q.input[1] not in self.inits or len(q.input) < 3 or q.input[2] != SHIFTED_ZP:
                continue  # only int8 (shifted) quantization: int16 keeps its Relu before Q
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
            self.clamped.append(clipped)
            moved += 1
        # the clamp now follows its Q: restore topological order
        if moved:
            nodes = _topological(order)
            del graph.node[:]
            graph.node.extend(nodes)
            self._index()
        return moved

    def unsigned_after_clamp(self, clamped: list[str]) -> set[str]:
        """Each `op -> Q(s, 128) -> Max(q, 128)` (or Clip from >= 128) making `clamped` whose readers
        all dequantize becomes `op -> Q(s, 0) -> Min(q, 127)` (or the Clip's bounds - 128) in
        uint8: the same values 0..127, with zero point 0. Returns the dequantized weights of the
        weight ops that read only such tensors: they keep int8 (u8s8 cannot saturate there)."""
        zp0 = self._u8("int8form::zp_u8_0", np.array(0, np.uint8))
        top = self._u8("int8form::u8_127", np.array(INT8_MAX, np.uint8))
        unsigned: set[str] = set()
        for out in clamped:
            clamp = self.producer[out]
            raw = clamp.input[0]
            q = self.producer.get(raw)
            readers = self.readers.get(out, [])
            if q is None or q.op_type != "QuantizeLinear" or len(q.input) < 3 or not readers:
                continue
            if q.input[2] != SHIFTED_ZP:
                continue  # an int16 (or otherwise kept) tensor: not the int8 form
            if any(
                r.op_type != "DequantizeLinear"
                or r.input[0] != out
                or len(r.input) < 3
                or r.input[2] != SHIFTED_ZP
                for r in readers
            ):
                continue
            if out in {o.name for o in self.model.graph.output}:
                continue
            if clamp.op_type == "Max":
                bounds = [zp0, top]
            else:
                low = self._value(clamp.input[1]) if len(clamp.input) > 1 and clamp.input[1] else 0
                high = (
                    self._value(clamp.input[2]) if len(clamp.input) > 2 and clamp.input[2] else 255
                )
                if low < SHIFT:
                    continue  # the Clip lets negative values through: zero point 128 it stays
                bounds = [
                    self._u8(f"{out}::clip_lo_u8", np.array(low - SHIFT, np.uint8)),
                    self._u8(f"{out}::clip_hi_u8", np.array(min(high - SHIFT, INT8_MAX), np.uint8)),
                ]
            q.input[2] = zp0  # saturates at 0: below zero it already clamps
            clamp.op_type = "Clip"
            del clamp.input[:]
            clamp.input.extend([raw, *bounds])
            for r in readers:
                r.input[2] = zp0
            unsigned.add(out)
        keep: set[str] = set()
        weight_ops = ("Conv", "Gemm", "MatMul")
        for node in self.model.graph.node:
            if node.op_type != "DequantizeLinear" or node.input[0] not in self.inits:
                continue
            users = self.readers.get(node.output[0], [])
            if users and all(
                u.op_type in weight_ops
                and len(u.input) > 1
                and u.input[1] == node.output[0]
                and (self.producer.get(u.input[0]) is not None)
                and self.producer[u.input[0]].op_type == "DequantizeLinear"
                and self.producer[u.input[0]].input[0] in unsigned
                for u in users
            ):
                keep.add(node.output[0])
        return keep

    def _constant(self, name: str) -> float | None:
        """The value of scalar constant `name` (initializer or Constant node), else None."""
        if name not in self.constants:
            return None
        value = constant_value(self.model, name)
        return float(value) if value is not None and np.size(value) == 1 else None

    def _only_reader(self, name: str, op_type: str) -> onnx.NodeProto | None:
        readers = self.readers.get(name, [])
        if len(readers) == 1 and readers[0].op_type == op_type:
            return readers[0]
        return None

    def _other_input(self, node: onnx.NodeProto, name: str) -> str | None:
        """The input of binary `node` that is not `name` (None if both are)."""
        if len(node.input) != 2 or name not in node.input:
            return None
        other = node.input[1] if node.input[0] == name else node.input[0]
        return None if other == name else other

    def _is(self, name: str | None, value: float, tol: float = 1e-4) -> bool:
        got = self._constant(name) if name else None
        return got is not None and abs(got - value) <= tol * max(1.0, abs(value))

    def fuse_gelu(self) -> int:
        """The exporter's erf GELU, x/sqrt(2) -> Erf -> +1 -> *x -> *0.5 (or 0.5*x times it),
        becomes one com.microsoft Gelu of x: the same function, one pass instead of five.

        ORT fuses this chain itself only where one tensor feeds both the Div and the Mul; in a
        Q/DQ graph its QDQ pass first gives each reader of a DequantizeLinear its own copy, so
        the chain stayed five float passes per GELU (ViT-S/16's integer session, 1 thread,
        measured by hand: 54.0 ms with them, 52.9 ms with one Gelu each)."""
        graph = self.model.graph
        outputs = {o.name for o in graph.output}
        fused: dict[int, onnx.NodeProto] = {}  # id of the node replaced -> the Gelu
        dropped: set[int] = set()
        for erf in list(graph.node):
            if erf.op_type != "Erf":
                continue
            div = self.producer.get(erf.input[0])
            if div is None or div.op_type not in ("Div", "Mul") or len(div.input) != 2:
                continue
            x, scale = div.input
            if not (
                (div.op_type == "Div" and self._is(scale, float(np.sqrt(2.0))))
                or (div.op_type == "Mul" and self._is(scale, float(np.sqrt(0.5))))
            ):
                continue
            add = self._only_reader(erf.output[0], "Add")
            if add is None or not self._is(self._other_input(add, erf.output[0]), 1.0):
                continue
            mul = self._only_reader(add.output[0], "Mul")
            if mul is None or len(self.readers.get(div.output[0], [])) != 1:
                continue
            other = self._other_input(mul, add.output[0])
            half = self.producer.get(other) if other else None
            chain = [div, erf, add, mul]
            if other == x:  # (x * (1 + erf)) * 0.5
                last = self._only_reader(mul.output[0], "Mul")
                if last is None or not self._is(self._other_input(last, mul.output[0]), 0.5):
                    continue
                chain.append(last)
            elif (
                half is not None
                and half.op_type == "Mul"
                and self._other_input(half, x) is not None
                and self._is(self._other_input(half, x), 0.5)
                and len(self.readers.get(half.output[0], [])) == 1
            ):  # (0.5 * x) * (1 + erf)
                last = mul
                chain.append(half)
            else:
                continue
            if any(n.output[0] in outputs for n in chain if n is not last):
                continue  # an intermediate the graph returns: keep it computed
            gelu = onnx.helper.make_node(
                "Gelu", [x], [last.output[0]], name=f"{last.name or last.output[0]}::gelu",
                domain="com.microsoft",
            )  # fmt: skip
            fused[id(last)] = gelu
            dropped.update(id(n) for n in chain if n is not last)
        if not fused:
            return 0
        nodes = [fused.get(id(n), n) for n in graph.node if id(n) not in dropped]
        del graph.node[:]
        graph.node.extend(nodes)
        if not any(o.domain == "com.microsoft" for o in self.model.opset_import):
            self.model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
        self._index()
        return len(fused)

    def pool_means(self) -> int:
        """A ReduceMean over every spatial axis (2..rank-1, keepdims) between a
        DequantizeLinear and a QuantizeLinear becomes GlobalAveragePool, the same mean, which
        ORT then fuses with its Q/DQ into QLinearGlobalAveragePool: an exact int32 sum and one
        requantization instead of a float copy of the whole tensor and a float reduction.
        Like every fused integer kernel here it rounds once, so an output may differ from the
        float chain by one step where the mean lies at a rounding edge. MobileNetV3-small's ten
        squeeze-excitation means took 0.31 ms of its 5.6 ms integer session (1 thread, ORT's
        profiler) as float ReduceMean; one of them reads a DequantizeLinear and is pooled, the
        other nine read HardSwish outputs the reference graph keeps in float, and stay."""
        candidates = [
            node
            for node in self.model.graph.node
            if node.op_type == "ReduceMean"
            and self._single_q_reader(node.output[0])
            and (self.producer.get(node.input[0]) or onnx.NodeProto()).op_type == "DequantizeLinear"
            and node.input[0] not in self.inits
        ]
        if not candidates:
            return 0
        ranks = _ranks(self.model)
        pooled = 0
        for node in candidates:
            rank = ranks.get(node.input[0])
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            axes = attrs.get("axes")
            if axes is None and len(node.input) > 1 and node.input[1]:
                value = constant_value(self.model, node.input[1])
                axes = None if value is None else [int(a) for a in np.ravel(value)]
            if rank is None or rank < 3 or axes is None or not attrs.get("keepdims", 1):
                continue
            if sorted(a % rank for a in axes) != list(range(2, rank)):
                continue
            node.op_type = "GlobalAveragePool"
            del node.input[1:]
            del node.attribute[:]
            pooled += 1
        return pooled

    def _single_q_reader(self, name: str) -> bool:
        outputs = {o.name for o in self.model.graph.output}
        return name not in outputs and self._only_reader(name, "QuantizeLinear") is not None

    def _value(self, name: str) -> int:
        init = self.new_inits.get(name) or self.inits.get(name)
        return int(numpy_helper.to_array(init))

    def finish(self) -> onnx.ModelProto:
        graph = self.model.graph
        used = {n for node in graph.node for n in node.input}
        kept = [i for i in graph.initializer if i.name in used]
        kept += [i for n, i in self.new_inits.items() if n in used]
        del graph.initializer[:]
        graph.initializer.extend(kept)
        return self.model


def _ranks(model: onnx.ModelProto) -> dict[str, int]:
    """The rank of each tensor that ONNX shape inference can tell (inputs, value_info)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001  (no ranks: nothing is rewritten that needs one)
        inferred = model
    graph = inferred.graph
    ranks = {}
    for info in (*graph.input, *graph.value_info, *graph.output):
        tensor = info.type.tensor_type
        if tensor.HasField("shape"):
            ranks[info.name] = len(tensor.shape.dim)
    return ranks


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
    """A copy of the Q/DQ `model` rewritten for kernel path `path` (one of PATHS)."""
    if path not in PATHS:
        raise ValueError(f"kernel path must be one of {PATHS}, not {path!r}")
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    rewriter = _Rewriter(copy)
    rewriter.shift_activations()
    rewriter.clamp_after_quantize()  # after the shift: the clamp compares with the new zero point
    rewriter.fuse_gelu()
    rewriter.pool_means()
    if path == "u8u8":
        rewriter.shift_weights()
    elif path == "mixed":
        rewriter.shift_weights(keep_int8=rewriter.unsigned_after_clamp(rewriter.clamped))
    return rewriter.finish()

"""Elementwise float islands of the integer-form graph as table lookups.

Between two quantized tensors, a chain of elementwise float ops (hardswish, hard-sigmoid, SiLU,
GELU, a squeeze-excitation scale: DequantizeLinear -> f -> QuantizeLinear) is a function of one
or two 8-bit values per element, so it has at most 256 (65536) results, which a table can hold;
ONNX Runtime runs them as a dequantize, one float kernel per op and a quantize, each a pass over
the tensor. This pass replaces each such chain with one
`torch_fl.bpu` Lookup op (csrc/runtime/ort_lookup.cpp) whose table holds the chain's result for
every input byte (pair).

Each table is computed by running the replaced chain itself, the same nodes with the same
constants, in an ONNX Runtime session set up as the float path's (Q/DQ kept as float rounding
steps), on every possible input: the lookup returns exactly what the float ops return for that
input. That holds where an op computes each element by the same formula wherever it sits in a
tensor, which `ELEMENTWISE` lists (tests/unit/test_lookups.py checks each on long, odd-length
tensors against its table).

The replaced nodes read only the chain's 8-bit inputs and scalar constants, and none of their
results is read outside the chain unless some other node keeps computing it (a hardswish whose
output also feeds a float ReduceMean stays for that reader; the lookup still saves its
multiply and quantize).

A clamp of quantized values by constants (`Max(q, zero point)`: the Relu that
conversion/integer_form.py moves after its quantization; a `Min` or a `Clip` with constant
bounds) is a function of one byte too: it becomes the same lookup, its table the clamp of every
byte value, computed exactly in numpy. ONNX Runtime runs such a Max as a broadcasting
elementwise kernel (MobileNetV3's fourteen: 55 us of its session at batch 1 on one thread by
ORT's profiler, 78 us on two); as lookups its session ran 1.182 against 1.189 ms on one thread
and 0.822 against 0.826 ms on two (medians of 40 blocks of ten runs in turns, by hand: the
profiler's per-node cost had inflated the small ops). The op runs a clamp's table as a max and a
min, over its input's buffer where ONNX Runtime knows the shapes (conversion/session_shapes.py).
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from torch_fl.bpu.conversion.export import constant_names
from torch_fl.bpu.conversion.pair_product import Product, fit
from torch_fl.bpu.conversion.qlinear_conv import drop_unread

DOMAIN = "torch_fl.bpu"
# Ops whose every output element is one formula of the same-position input elements. Each has a
# test that a table of it equals the op on long tensors (tests/unit/test_lookups.py).
ELEMENTWISE: frozenset[tuple[str, str]] = frozenset(
    [
        ("", op)
        for op in (
            "Abs",
            "Add",
            "Clip",
            "Div",
            "Elu",
            "Erf",
            "Exp",
            "HardSigmoid",
            "HardSwish",
            "LeakyRelu",
            "Max",
            "Min",
            "Mul",
            "Neg",
            "Relu",
            "Sigmoid",
            "Softplus",
            "Sqrt",
            "Sub",
            "Tanh",
        )
    ]  # fmt: skip
    # ORT's optimizer writes these for GELU and SiLU (x * sigmoid(alpha * x)) patterns
    + [("com.microsoft", op) for op in ("FastGelu", "Gelu", "QuickGelu")]
)
# Ops that only reshape or pick elements: between the 8-bit input and the result of a one-input
# chain (the exporter's flatten around a Linear's GELU: DQ -> Reshape -> Gelu -> Reshape -> Q;
# attention's q, k and v gathered from one dequantized tensor: DQ -> Squeeze -> Gather -> Q)
# they move, with the same constant shapes, indices and permutations, before the lookup, onto
# its 8-bit input: an elementwise function commutes with them, and a Gather or Slice first
# leaves the lookup fewer elements. A chain of them alone between a DQ and a Q of another scale
# is a requantization, a table too; of the same scale and type, no lookup at all.
SHAPE_OPS = frozenset(
    {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Gather", "Slice", "Transpose"}
)
MAX_CHAIN = 16  # nodes in one replaced chain
_OPS = {  # (output element type, inputs) -> op name
    (TensorProto.UINT8, 1): "LookupU8",
    (TensorProto.INT8, 1): "LookupI8",
    (TensorProto.UINT8, 2): "Lookup2U8",
    (TensorProto.INT8, 2): "Lookup2I8",
}
_NUMPY = {TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8}
# a two-input table that is a product of two float tables (conversion/pair_product.py)
_PRODUCT_OPS = {TensorProto.UINT8: "Lookup2MulU8", TensorProto.INT8: "Lookup2MulI8"}


@dataclass(frozen=True)
class _Chain:
    end: str  # the tensor the lookup computes
    quantize: onnx.NodeProto | None  # the Q that ends it (None: its result is float)
    nodes: tuple[onnx.NodeProto, ...]  # in graph order, shape ops among them
    leaves: tuple[onnx.NodeProto, ...]  # the DequantizeLinear nodes it reads, one per input

    @property
    def shape_ops(self) -> tuple[onnx.NodeProto, ...]:
        return tuple(n for n in self.nodes if _is_shape_op(n))


class _Graph:
    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        graph = model.graph
        self.producer = {o: n for n in graph.node for o in n.output}
        self.order = {id(n): i for i, n in enumerate(graph.node)}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                self.readers.setdefault(name, []).append(node)
        self.outputs = {o.name for o in graph.output}
        self.constant_names = constant_names(model)
        self._values: dict[str, np.ndarray | None] = {}

    @functools.cached_property
    def sizes(self) -> dict[str, int]:
        """Static element counts (shape inference over the whole graph: only when a two-input
        chain needs its inputs ordered)."""
        return _static_sizes(self.model)

    def value(self, name: str) -> np.ndarray | None:
        """The value of constant `name` (initializer or Constant output), else None."""
        if name not in self.constant_names:
            return None
        if name not in self._values:
            self._values[name] = _constant(self.model, name)
        return self._values[name]

    def scalar(self, name: str) -> bool:
        value = self.value(name)
        return value is not None and value.size == 1

    def byte_tensor_params(self, node: onnx.NodeProto) -> bool:
        """A Q or DQ with scalar scale and zero point constants, 8-bit on its integer side."""
        if len(node.input) < 2 or not self.scalar(node.input[1]):
            return False
        if len(node.input) > 2 and node.input[2]:
            zero = self.value(node.input[2])
            return zero is not None and zero.size == 1 and zero.dtype in (np.uint8, np.int8)
        return node.op_type == "QuantizeLinear"  # no zero point: uint8 output (DQ: unknown input)

    def quantized_chain(self, quantize: onnx.NodeProto) -> _Chain | None:
        """The elementwise chain `quantize` ends, if it qualifies for a byte table."""
        if quantize.domain not in ("", "ai.onnx") or not self.byte_tensor_params(quantize):
            return None
        return self._chain(quantize.output[0], quantize.input[0], quantize, max_inputs=2)

    def float_chain(self, node: onnx.NodeProto) -> _Chain | None:
        """The chain of one input that ends in elementwise `node`, whose float result only
        other kinds of op read (a ReduceMean, a Softmax): a table of 256 floats."""
        if (node.domain or "", node.op_type) not in ELEMENTWISE or len(node.output) != 1:
            return None
        end = node.output[0]
        readers = self.readers.get(end, [])
        if end in self.outputs or not readers:
            return None
        for reader in readers:
            if (reader.domain or "", reader.op_type) in ELEMENTWISE:
                return None  # part of a longer chain
            if reader.op_type == "QuantizeLinear":
                return None  # a byte chain, or one that qualifies for none
        return self._chain(end, end, None, max_inputs=1)

    def _chain(
        self, end: str, start: str, quantize: onnx.NodeProto | None, max_inputs: int
    ) -> _Chain | None:
        nodes: dict[int, onnx.NodeProto] = {}
        leaves: dict[tuple, onnx.NodeProto] = {}
        stack = [start]
        seen: set[str] = set()
        while stack:
            name = stack.pop()
            if name in seen or not name:
                continue
            seen.add(name)
            if name in self.constant_names:
                if not self.scalar(name):
                    return None
                continue
            node = self.producer.get(name)
            if node is None:
                return None
            if node.op_type == "DequantizeLinear" and node.domain in ("", "ai.onnx"):
                if not self.byte_tensor_params(node):
                    return None
                # copies of one DQ (one per reader, as QDQ graphs have them) are one input
                leaves.setdefault(self.input_key(node), node)
                continue
            if _is_shape_op(node):
                if any(n not in self.constant_names for n in node.input[1:] if n):
                    return None  # a shape computed at run time
                stack.append(node.input[0])
            elif (node.domain or "", node.op_type) in ELEMENTWISE and len(node.output) == 1:
                stack.extend(node.input)
            else:
                return None
            nodes[id(node)] = node
            if len(nodes) > MAX_CHAIN:
                return None
        if not 1 <= len(leaves) <= max_inputs:
            return None
        ordered = sorted(nodes.values(), key=lambda n: self.order[id(n)])
        if all(_is_shape_op(n) for n in ordered) and (quantize is None or not ordered):
            return None  # no function to tabulate (moves alone between DQ and Q: requantize)
        if any(_is_shape_op(n) for n in ordered) and not self._single_path(ordered, leaves):
            return None
        if len(leaves) == 2 and len(ordered) == 1 and ordered[0].op_type in ("Add", "Mul"):
            return None  # ORT's own QLinearAdd / QLinearMul: vector integer kernels
        # the smaller input first: the op then runs one table row per element of it, a 1-D
        # lookup over the larger one (a per-channel scale: one row per channel)
        inputs = list(leaves.values())
        if len(inputs) == 2:
            inputs.sort(key=lambda n: self.sizes.get(n.input[0], 1 << 62))
        return _Chain(end, quantize, tuple(ordered), tuple(inputs))

    def _single_path(self, nodes: list[onnx.NodeProto], leaves: dict) -> bool:
        """Whether `nodes` form one path from one input (each reads one non-constant tensor):
        then reshaping commutes with the elementwise ops. Two branches reshaped differently
        would pair up different elements."""
        if len(leaves) != 1:
            return False
        for node in nodes:
            data = [n for n in (node.input[:1] if _is_shape_op(node) else node.input) if n]
            if sum(n not in self.constant_names for n in data) != 1:
                return False
        return True

    def input_key(self, dequantize: onnx.NodeProto) -> tuple:
        """What a DequantizeLinear computes: its input and its scale and zero point values
        (two copies of one DQ have equal keys)."""

        def value_key(name: str):
            value = self.value(name)
            return (value.dtype.str, value.tobytes()) if value is not None else name

        return (dequantize.input[0], *(value_key(n) for n in dequantize.input[1:]))


def _is_shape_op(node: onnx.NodeProto) -> bool:
    return node.domain in ("", "ai.onnx") and node.op_type in SHAPE_OPS


def _static_sizes(model: onnx.ModelProto) -> dict[str, int]:
    """Element counts of the tensors whose shapes ONNX shape inference knows in full."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001  (no sizes: inputs keep the order they were found in)
        return {}
    sizes = {}
    for info in (*inferred.input, *inferred.value_info, *inferred.output):
        dims = info.type.tensor_type.shape.dim
        if info.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            sizes[info.name] = int(np.prod([d.dim_value for d in dims], dtype=np.int64))
    return sizes


def _constant(model: onnx.ModelProto, name: str) -> np.ndarray | None:
    for init in model.graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output and node.output[0] == name:
            for attr in node.attribute:
                if attr.name == "value":
                    return numpy_helper.to_array(attr.t)
    return None


def _byte_type(graph: _Graph, node: onnx.NodeProto) -> int:
    """The 8-bit element type of a DQ's input or a Q's output (its zero point's)."""
    if len(node.input) > 2 and node.input[2]:
        return (
            TensorProto.INT8 if graph.value(node.input[2]).dtype == np.int8 else TensorProto.UINT8
        )
    return TensorProto.UINT8


def _all_inputs(types: list[int]) -> list[np.ndarray]:
    """Every byte (pair) in table order: input k's values, as its own element type."""
    codes = np.arange(256, dtype=np.uint8)
    if len(types) == 1:
        columns = [codes]
    else:
        columns = [np.repeat(codes, 256), np.tile(codes, 256)]  # index = a * 256 + b
    return [c.view(_NUMPY[t]) for c, t in zip(columns, types, strict=True)]


def table_model(graph: _Graph, chain: _Chain) -> tuple[onnx.ModelProto, list[np.ndarray]]:
    """The chain alone as a model over every input byte (pair), and those inputs."""
    types = [_byte_type(graph, leaf) for leaf in chain.leaves]
    feeds = _all_inputs(types)
    inputs, nodes, constants = [], [], set()
    for k, (leaf, kind) in enumerate(zip(chain.leaves, types, strict=True)):
        name = f"lookup_in{k}"
        inputs.append(helper.make_tensor_value_info(name, kind, [feeds[k].size]))
        copy = onnx.NodeProto()
        copy.CopyFrom(leaf)
        copy.input[0] = name
        nodes.append(copy)
        constants.update(n for n in leaf.input[1:] if n)
    # every other copy of a leaf DQ computes the same values under its own name
    renamed = {}
    for node in chain.nodes:
        for name in node.input:
            producer = graph.producer.get(name)
            if producer is not None and producer.op_type == "DequantizeLinear":
                key = graph.input_key(producer)
                twin = next(leaf for leaf in chain.leaves if graph.input_key(leaf) == key)
                renamed[name] = twin.output[0]
    for node in chain.shape_ops:  # the table is over flat inputs: the shapes come after
        renamed[node.output[0]] = renamed.get(node.input[0], node.input[0])
    for node in (*chain.nodes, *([chain.quantize] if chain.quantize else [])):
        if _is_shape_op(node):
            continue
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        for i, name in enumerate(copy.input):
            copy.input[i] = renamed.get(name, name)
        nodes.append(copy)
        constants.update(n for n in node.input if n in graph.constant_names)
    out_type = _byte_type(graph, chain.quantize) if chain.quantize else TensorProto.FLOAT
    outputs = [helper.make_tensor_value_info(chain.end, out_type, None)]
    initializers = [
        numpy_helper.from_array(np.asarray(graph.value(n)), n) for n in sorted(constants)
    ]
    body = helper.make_graph(nodes, "lookup_table", inputs, outputs, initializers)
    model = helper.make_model(body, opset_imports=list(graph.model.opset_import))
    model.ir_version = graph.model.ir_version
    return model, feeds


def _product(
    graph: _Graph,
    chain: _Chain,
    model: onnx.ModelProto,
    feeds: list[np.ndarray],
    table: np.ndarray,
) -> Product | None:
    """The product form of a two-input byte chain's `table` (conversion/pair_product.py), where
    the chain ends in a Mul of two tensors, each a function of one input, and a quantize."""
    if len(chain.leaves) != 2 or chain.quantize is None:
        return None
    mul = graph.producer.get(chain.quantize.input[0])
    if mul is None or mul.op_type != "Mul" or mul.domain not in ("", "ai.onnx"):
        return None
    factors = [n for n in mul.input if n]
    if len(factors) != 2 or any(n in graph.constant_names for n in factors):
        return None
    scale = graph.value(chain.quantize.input[1])
    zero = graph.value(chain.quantize.input[2]) if len(chain.quantize.input) > 2 else None
    if scale is None or (
        len(chain.quantize.input) > 2 and chain.quantize.input[2] and zero is None
    ):
        return None
    # a factor that is a dequantize is the chain's leaf of the same input in the table model
    for k, name in enumerate(factors):
        producer = graph.producer.get(name)
        if producer is not None and producer.op_type == "DequantizeLinear":
            key = graph.input_key(producer)
            factors[k] = next(
                (leaf.output[0] for leaf in chain.leaves if graph.input_key(leaf) == key), name
            )
    if not set(factors) <= {o for n in model.graph.node for o in n.output}:
        return None  # a factor reshaped on the way (the table model has no shape ops)
    # the table model again, its outputs the Mul's two inputs
    branches = onnx.ModelProto()
    branches.CopyFrom(model)
    del branches.graph.output[:]
    branches.graph.output.extend(
        helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in factors
    )
    first, second = compute_table(branches, feeds, outputs=2)
    # scalars, or one-element tensors (byte_tensor_params takes either)
    zp = int(np.asarray(zero).reshape(-1)[0]) if zero is not None else 0
    s = float(np.asarray(scale).reshape(-1)[0])
    return fit(first, second, table, s, zp, table.dtype == np.int8)


def compute_table(
    model: onnx.ModelProto, feeds: list[np.ndarray], outputs: int = 1
) -> np.ndarray | list[np.ndarray]:
    """Run a chain's table model as the float path runs it (Q/DQ as float rounding steps)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    session = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    results = session.run(None, dict(zip(names, feeds, strict=True)))
    return results[0] if outputs == 1 else results[:outputs]


def ort_optimized(model: onnx.ModelProto, disabled: Sequence[str] = ()) -> onnx.ModelProto:
    """ONNX Runtime's own optimized form of `model`, as its CPU session would run it (its
    fusions and layouts: NCHWc float convs, NHWC integer convs, with the transposes between them
    cancelled), without the optimizers named in `disabled`."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="torch_fl_sim_") as tmp:
        path = os.path.join(tmp, "optimized.onnx")
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = 1
        options.optimized_model_filepath = path
        ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"],
                             disabled_optimizers=list(disabled))  # fmt: skip
        return onnx.load(path)


def has_chains(model: onnx.ModelProto) -> bool:
    """Whether `model` has a chain `fuse_lookups` would replace (no table is computed)."""
    graph = _Graph(model)
    return any(
        (graph.quantized_chain(n) if n.op_type == "QuantizeLinear" else graph.float_chain(n))
        is not None
        or byte_clamp(graph, n) is not None
        for n in model.graph.node
    )


def fuse_lookups(model: onnx.ModelProto) -> int:
    """Replace, in place, every qualifying chain of `model` with a Lookup; returns how many.

    First the chains that end in a QuantizeLinear (byte tables); then, among what is left, the
    one-input chains whose float result feeds other kinds of op (float tables); then the clamps
    of quantized values by constants (byte tables, `byte_clamp`)."""
    count = _replace(model, lambda graph, node: graph.quantized_chain(node)
                     if node.op_type == "QuantizeLinear" else None)  # fmt: skip
    count += _replace(model, lambda graph, node: graph.float_chain(node))
    count += _replace_clamps(model)
    if count:
        import_domain(model)
    return count


CLAMPS = frozenset({"Max", "Min", "Clip"})


def byte_clamp(graph: _Graph, node: onnx.NodeProto) -> np.ndarray | None:
    """The 256-entry table of `node` where it clamps one 8-bit tensor by scalar constants of its
    type (`Max(q, z)`, `Min(q, c)`, `Clip(q, lo, hi)`, optional bounds left out); else None.

    The type is the constants' (ONNX gives these ops' inputs one type): a bound of another type
    or of rank above 0, a bound computed at run time or more than one non-constant input leaves
    the node alone."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in CLAMPS or len(node.output) != 1:
        return None
    data = [n for n in node.input if n and n not in graph.constant_names]
    if len(data) != 1 or (node.op_type == "Clip" and node.input[0] != data[0]):
        return None
    bounds = [graph.value(n) for n in node.input if n and n != data[0]]
    if not bounds or any(b is None or b.ndim != 0 for b in bounds):
        return None  # a bound of shape [1] would broadcast a scalar input to [1]
    kinds = {b.dtype for b in bounds}
    if len(kinds) != 1 or kinds.pop() not in (np.uint8, np.int8):
        return None
    kind = bounds[0].dtype
    values = np.arange(256, dtype=np.uint8).view(kind)  # every byte, in table order
    if node.op_type == "Max":
        return np.maximum.reduce([values, *(np.full(256, b, kind) for b in bounds)]).astype(kind)
    if node.op_type == "Min":
        return np.minimum.reduce([values, *(np.full(256, b, kind) for b in bounds)]).astype(kind)
    info = np.iinfo(kind)
    low = graph.value(node.input[1]) if len(node.input) > 1 and node.input[1] else info.min
    high = graph.value(node.input[2]) if len(node.input) > 2 and node.input[2] else info.max
    return np.minimum(np.maximum(values, kind.type(low)), kind.type(high)).astype(kind)


def _replace_clamps(model: onnx.ModelProto) -> int:
    """Each byte clamp (`byte_clamp`) becomes a LookupU8 / LookupI8 in its place."""
    graph = _Graph(model)
    count = 0
    for i, node in enumerate(model.graph.node):
        table = byte_clamp(graph, node)
        if table is None:
            continue
        out = node.output[0]
        name = f"lookup_table::{out}"
        kind = TensorProto.UINT8 if table.dtype == np.uint8 else TensorProto.INT8
        model.graph.initializer.append(numpy_helper.from_array(table, name))
        data = next(n for n in node.input if n and n not in graph.constant_names)
        lookup = helper.make_node(
            _OPS[(kind, 1)], [name, data], [out], name=f"lookup::{out}", domain=DOMAIN
        )
        model.graph.node[i].CopyFrom(lookup)
        count += 1
    if count:
        drop_unread(model)
    return count


def import_domain(model: onnx.ModelProto) -> None:
    """Declare the extension's op domain in `model`, once."""
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))


def _replace(model: onnx.ModelProto, find) -> int:
    """One pass: each chain `find(graph, node)` returns becomes a Lookup node in its last node's
    place; the nodes nothing reads any more go."""
    graph = _Graph(model)
    replaced: dict[int, list[onnx.NodeProto]] = {}  # id(last node) -> its Lookup (+ shape ops)
    tables: list[onnx.TensorProto] = []
    for node in list(model.graph.node):
        chain = find(graph, node)
        if chain is None:
            continue
        model_and_feeds = table_model(graph, chain)
        table = compute_table(*model_and_feeds)
        extra: list[str] = []
        if chain.quantize is not None:
            out_type = _byte_type(graph, chain.quantize)
            table = table.astype(_NUMPY[out_type])
            op = _OPS[(out_type, len(chain.leaves))]
            product = _product(graph, chain, *model_and_feeds, table)
            if product is not None:
                op = _PRODUCT_OPS[out_type]
                arrays = (product.a_floats, product.b_floats, product.quant)
                extra = [f"lookup_product::{chain.end}/{p}" for p in ("a", "b", "quant")]
                tables += [
                    numpy_helper.from_array(a, n) for a, n in zip(arrays, extra, strict=True)
                ]
        else:
            table, op = table.astype(np.float32), "LookupF32"
        sources = [leaf.input[0] for leaf in chain.leaves]
        moves = _moved(chain.shape_ops, sources[0], chain.end) if chain.shape_ops else []
        if moves:  # one input (_single_path): its moves first, on its bytes
            sources[0] = moves[-1].output[0]
        if moves and _identity(table, graph, chain):
            moves[-1].output[0] = chain.end  # the same scale and type: only the moves are left
            replaced[id(node)] = moves
            continue
        name = f"lookup_table::{chain.end}"
        tables.append(numpy_helper.from_array(table, name))
        lookup = helper.make_node(
            op, [name, *sources, *extra], [chain.end], name=f"lookup::{chain.end}", domain=DOMAIN
        )
        replaced[id(node)] = [*moves, lookup]
    if not replaced:
        return 0
    nodes = [m for n in model.graph.node for m in replaced.get(id(n), [n])]
    del model.graph.node[:]
    model.graph.node.extend(_live(nodes, {o.name for o in model.graph.output}))
    model.graph.initializer.extend(tables)
    drop_unread(model)
    return len(replaced)


def _moved(shape_ops, source: str, end: str) -> list[onnx.NodeProto]:
    """Copies of a chain's shape ops, in order, from its 8-bit input `source`: the last one's
    output is what the lookup of chain `end` reads."""
    copies = []
    for k, node in enumerate(shape_ops):
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.input[0] = source
        source = f"{end}::moved{k}"
        del copy.output[:]
        copy.output.append(source)
        copy.name = f"lookup::{end}::moved{k}"
        copies.append(copy)
    return copies


def _identity(table: np.ndarray, graph: _Graph, chain: _Chain) -> bool:
    """Whether a one-input byte table maps every byte to itself, its input and output of one
    type (a DQ and a Q of the same scale and zero point around moves only)."""
    if chain.quantize is None or len(chain.leaves) != 1 or table.dtype == np.float32:
        return False
    if _byte_type(graph, chain.leaves[0]) != _byte_type(graph, chain.quantize):
        return False
    return bool(np.array_equal(table.view(np.uint8), np.arange(256, dtype=np.uint8)))


def _live(nodes: list[onnx.NodeProto], outputs: set[str]) -> list[onnx.NodeProto]:
    """`nodes` without those whose results nothing reads any more (the replaced chains)."""
    keep = [True] * len(nodes)
    needed = set(outputs)
    for i in range(len(nodes) - 1, -1, -1):  # graph order is topological: readers come later
        node = nodes[i]
        if any(o in needed for o in node.output):
            needed.update(n for n in node.input if n)
        else:
            keep[i] = False
    return [n for n, k in zip(nodes, keep, strict=True) if k]

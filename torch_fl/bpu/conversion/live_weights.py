"""Frozen weights as ONNX graph inputs: one export, two forms of the same graph.

The partition is exported with every placeholder as a graph input, the frozen ones (parameters,
buffers) named after their placeholders. From that export:

- `bake` evaluates the weight-only part of the graph (a Transpose of a linear weight, ...) with
  the current values and makes the results initializers. This is what calibration observes, what
  the Q/DQ pass quantizes, what the cache key hashes and what hbdk4 compiles: an artifact must
  hold its weights.
- `make_live` turns the *quantized* baked graph back into one that reads the weights as inputs on
  every call: the weight-only nodes are put back, and each weight the Q/DQ pass turned into an
  int8 initializer is quantized in the graph instead, with the same arithmetic (per-channel
  `max|w|/127`, raised per channel where the live bias needs it to fit int32 (`qdq.bias_floor`),
  round half to even, within [-127, 127]; int32 biases at activation scale x weight scale,
  computed in float64 and clipped, never wrapped). The DequantizeLinear nodes the Q/DQ pass wrote stay; only
  their int8 input and scale are now computed. A host executor running this graph can never run
  stale weights, and its int8 tensors are still explicit for integer kernels.

Nothing here knows the Q/DQ pass's tensor names: the rewiring follows the graph (which slot of
which quantized op reads which DequantizeLinear), so the pass may rename freely.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from torch_fl.bpu.conversion.export import attribute
from torch_fl.bpu.conversion.qdq import BIAS_QMAX, QMAX16, QUANTIZED_WEIGHT_OPS, input_scale
from torch_fl.bpu.errors import QuantizationError

QMAX = 127.0
# QUANTIZED_WEIGHT_OPS (op -> weight slot, bias slot) is the Q/DQ pass's own table, so the slots
# rewired here are always the ones it quantized


@dataclass(frozen=True)
class WeightGraph:
    """A float export whose frozen weights are graph inputs."""

    model: onnx.ModelProto
    weights: tuple[str, ...]
    weight_nodes: tuple[onnx.NodeProto, ...]
    """Nodes that read only weights and constants, in graph order."""
    frontier: tuple[str, ...]
    """Weight-only tensors (weights included) read by the rest of the graph or returned."""


def split(model: onnx.ModelProto, weights: Sequence[str]) -> WeightGraph:
    """Find the weight-only subgraph of `model` (weights are graph inputs named in `weights`)."""
    weight_set = set(weights)
    inits = {i.name for i in model.graph.initializer}
    derived = set(weight_set)
    weight_nodes = []
    for node in model.graph.node:
        inputs = [name for name in node.input if name]
        if inputs and any(n in derived for n in inputs):
            if all(n in derived or n in inits for n in inputs):
                weight_nodes.append(node)
                derived.update(node.output)
    weight_node_ids = {id(node) for node in weight_nodes}
    frontier: list[str] = []
    for node in model.graph.node:
        if id(node) in weight_node_ids:
            continue
        for name in node.input:
            if name in derived and name not in frontier:
                frontier.append(name)
    for out in model.graph.output:
        if out.name in derived and out.name not in frontier:
            frontier.append(out.name)
    return WeightGraph(model, tuple(weights), tuple(weight_nodes), tuple(frontier))


def _evaluate(wg: WeightGraph, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Values of the frontier tensors the weight-only nodes produce (plain ORT, no rewrites)."""
    wanted = [name for name in wg.frontier if name not in wg.weights]
    if not wanted:
        return {}
    import onnxruntime as ort

    used = {name for node in wg.weight_nodes for name in node.input}
    graph = helper.make_graph(
        list(wg.weight_nodes),
        "weights",
        [i for i in wg.model.graph.input if i.name in wg.weights],
        [helper.make_empty_tensor_value_info(name) for name in wanted],
        [i for i in wg.model.graph.initializer if i.name in used],
    )
    sub = helper.make_model(graph, opset_imports=wg.model.opset_import)
    sub.ir_version = wg.model.ir_version
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(sub.SerializeToString(), options, ["CPUExecutionProvider"])
    feed = {i.name: values[i.name] for i in session.get_inputs()}
    return dict(zip(wanted, session.run(wanted, feed), strict=True))


def _drop_unused_initializers(graph: onnx.GraphProto) -> None:
    used = {name for node in graph.node for name in node.input}
    used.update(o.name for o in graph.output)
    kept = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def bake(wg: WeightGraph, values: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """The export with the weight-only part evaluated into initializers (weights baked in)."""
    computed = _evaluate(wg, values)
    model = onnx.ModelProto()
    model.CopyFrom(wg.model)
    graph = model.graph
    weight_outputs = {out for node in wg.weight_nodes for out in node.output}
    kept_nodes = [n for n in graph.node if not (set(n.output) & weight_outputs)]
    del graph.node[:]
    graph.node.extend(kept_nodes)
    inputs = [i for i in graph.input if i.name not in wg.weights]
    del graph.input[:]
    graph.input.extend(inputs)
    existing = {i.name for i in graph.initializer}
    for name in wg.frontier:
        if name in existing:
            continue
        array = computed[name] if name in computed else values[name]
        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
    _drop_unused_initializers(graph)
    return model


class _Builder:
    """Adds the nodes that quantize live weights, with names that cannot collide."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: dict[str, TensorProto] = {}
        self.count = 0

    def const(self, value, dtype) -> str:
        array = np.array(value, dtype=dtype)
        name = f"live::const_{array.dtype.name}_{array.tobytes().hex()}_{array.ndim}"
        if name not in self.inits:
            self.inits[name] = numpy_helper.from_array(array, name)
        return name

    def op(self, op_type: str, inputs: Sequence[str], **attrs) -> str:
        self.count += 1
        out = f"live::{op_type}_{self.count}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], out, **attrs))
        return out

    def weight(
        self,
        name: str,
        ndim: int,
        axis: int | None,
        floor: tuple[str, float] | None = None,
        wide: bool = False,
    ) -> tuple[str, str]:
        """(int8 or int16 weight, scale) of the float tensor `name`, as the Q/DQ pass computes them;
        `floor` = (bias tensor, input scale): each channel's scale at least the one at which the
        int32 bias holds that bias (`qdq.bias_floor`, in the graph: the bias is live too); `wide`:
        int16 per channel (max|w|/32767), the weights of a dual-int16 layer."""
        qmax = float(QMAX16) if wide else QMAX
        axes = [i for i in range(ndim) if i != axis] if axis is not None else list(range(ndim))
        amax = self.op("ReduceMax", [self.op("Abs", [name])], axes=axes, keepdims=1)
        raw = self.op("Div", [amax, self.const(qmax, np.float32)])
        positive = self.op("Greater", [raw, self.const(0.0, np.float32)])
        # an all-zero channel would divide by zero; any scale represents zeros exactly
        scale = self.op("Where", [positive, raw, self.const(1.0, np.float32)])
        if floor is not None and axis is not None:
            bias, act_scale = floor
            magnitude = self.op("Abs", [self.op("Cast", [bias], to=TensorProto.DOUBLE)])
            need = self.op("Div", [magnitude, self.const(act_scale * BIAS_QMAX, np.float64)])
            need = self.op("Mul", [need, self.const(1 + 2**-20, np.float64)])
            shape = self.const([-1 if i == axis else 1 for i in range(ndim)], np.int64)
            need = self.op("Reshape", [self.op("Cast", [need], to=TensorProto.FLOAT), shape])
            scale = self.op("Max", [scale, need])
        rounded = self.op("Round", [self.op("Div", [name, scale])])
        # No Clip to [-127, 127]: |w| <= max|w| and scale >= (max|w|/127)(1 - 2**-24), so
        # |w / scale| < 127.5 and rounds to at most 127 (saves a pass over every weight).
        q = self.op("Cast", [rounded], to=TensorProto.INT16 if wide else TensorProto.INT8)
        flat = self.const([-1] if axis is not None else [], np.int64)
        return q, self.op("Reshape", [scale, flat])

    def plus(self, name: str, delta: Sequence[float] | np.ndarray) -> str:
        """`name` + the constant vector `delta` (a bias correction)."""
        const = f"live::bias_delta::{name}"
        array = np.asarray(delta, np.float32).reshape(-1)
        self.inits[const] = numpy_helper.from_array(array, const)
        return self.op("Add", [name, const])

    def bias(self, name: str, weight_scale: str, act_scale: float) -> tuple[str, str]:
        """(int32 bias, scale): scale = float32(act * w_scale in float64), q = rint(b / scale)
        clipped to +-BIAS_QMAX."""
        wide = self.op("Cast", [weight_scale], to=TensorProto.DOUBLE)
        scale64 = self.op("Mul", [wide, self.const(act_scale, np.float64)])
        scale = self.op("Cast", [scale64], to=TensorProto.FLOAT)
        ratio = self.op(
            "Div",
            [
                self.op("Cast", [name], to=TensorProto.DOUBLE),
                self.op("Cast", [scale], to=TensorProto.DOUBLE),
            ],
        )
        # Clipped like the Q/DQ pass's bias, never wrapped (the weight scale's bias floor makes
        # the clip a no-op; kept as the guarantee).
        bounds = [self.const(-BIAS_QMAX, np.float64), self.const(BIAS_QMAX, np.float64)]
        clipped = self.op("Clip", [self.op("Round", [ratio]), *bounds])
        q = self.op("Cast", [clipped], to=TensorProto.INT32)
        return q, scale


def make_live(
    wg: WeightGraph,
    baked: onnx.ModelProto,
    quantized: onnx.ModelProto,
    act_scales: Mapping[str, float],
    default_scale: float,
    bias_delta: Mapping[str, np.ndarray] | None = None,
    precision: Mapping[str, str] | None = None,
) -> onnx.ModelProto:
    """`quantized` (the Q/DQ pass applied to `baked`, with `precision`) reading its weights as
    inputs; a bias named in `bias_delta` (bias correction) is quantized as live bias + delta."""
    live = onnx.ModelProto()
    live.CopyFrom(quantized)
    graph = live.graph
    frontier = set(wg.frontier)
    ranks = {}
    for value in list(wg.model.graph.input) + list(wg.model.graph.value_info):
        dims = value.type.tensor_type.shape.dim
        ranks[value.name] = len(dims)
    inits = {i.name for i in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    before = [n for n in baked.graph.node if n.op_type in QUANTIZED_WEIGHT_OPS]
    after = [n for n in graph.node if n.op_type in QUANTIZED_WEIGHT_OPS]
    if [n.op_type for n in before] != [n.op_type for n in after]:
        raise QuantizationError(
            "the Q/DQ pass added or removed weight ops; cannot make weights live"
        )
    build = _Builder()
    for old, new in zip(before, after, strict=True):
        w_slot, b_slot = QUANTIZED_WEIGHT_OPS[old.op_type]
        if len(old.input) <= w_slot or old.input[w_slot] not in frontier:
            continue
        weight = old.input[w_slot]
        dq = producer.get(new.input[w_slot])
        if dq is None or new.input[w_slot] == weight:
            continue  # left in float by the pass: the live tensor is read directly
        if dq.op_type != "DequantizeLinear" or dq.input[0] not in inits:
            raise QuantizationError(f"unexpected weight quantization of {weight!r}: {dq.op_type}")
        axis = attribute(dq, "axis") if len(dq.input) > 1 else None
        if weight not in ranks:
            raise QuantizationError(f"no shape recorded for weight tensor {weight!r}")
        bias = old.input[b_slot] if b_slot is not None and len(old.input) > b_slot else None
        bdq = producer.get(new.input[b_slot]) if bias is not None else None
        wide = (precision or {}).get(old.input[0]) == "dual_int16"
        if bias not in frontier or bdq is None or new.input[b_slot] == bias:
            q, scale = build.weight(weight, ranks[weight], axis, wide=wide)
            dq.input[0], dq.input[1] = q, scale
            continue
        act_scale = input_scale(old.input[0], act_scales, default_scale, precision)
        if bias_delta and bias in bias_delta:
            bias = build.plus(bias, bias_delta[bias])
        q, scale = build.weight(weight, ranks[weight], axis, (bias, act_scale), wide)
        dq.input[0], dq.input[1] = q, scale
        qb, bscale = build.bias(bias, scale, act_scale)
        bdq.input[0], bdq.input[1] = qb, bscale
    nodes = [*wg.weight_nodes, *build.nodes, *graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    computed = [i for i in graph.initializer if i.name not in frontier]
    del graph.initializer[:]
    graph.initializer.extend(computed)
    present = {i.name for i in graph.initializer}
    used_by_weight_nodes = {name for node in wg.weight_nodes for name in node.input}
    for init in wg.model.graph.initializer:
        if init.name in used_by_weight_nodes and init.name not in present:
            graph.initializer.append(init)
    graph.initializer.extend(build.inits.values())
    graph.input.extend(i for i in wg.model.graph.input if i.name in wg.weights)
    _drop_unused_initializers(graph)
    return live

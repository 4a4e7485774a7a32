"""Insert int8 QuantizeLinear/DequantizeLinear pairs: the form hbdk4 places on the BPU.

A float conv compiles but hbdk4 lowers it to the CPU, so Q/DQ is what moves work onto the BPU.
Scheme (symmetric, signed int8, zero point 0, as hbdk4 expects):
- weights of Conv/Gemm/MatMul: per output channel, scale_c = max|w_c| / 127, values in
  [-127, 127]; the int8 tensor is the initializer, a DequantizeLinear with `axis` restores it;
- biases: int32 with scale = activation scale * weight scale_c (what the BPU accumulates in); a
  channel whose bias would leave int32 at that scale gets a larger weight scale instead
  (`bias_floor`), never the shared activation scale;
- activations feeding Conv/Gemm/MatMul/pooling: one Q/DQ pair per tensor, scale from calibration
  (keyed by tensor name) or the default activation scale;
- outputs: each Conv/Gemm, and each MatMul with a constant weight, is requantized to int8 where
  it ends (`requant_points`: its output, or the output of the Relu or constant-bound Clip (ReLU6)
  that is its only reader: both commute with quantization), as
  the BPU writes a conv's result back; that makes every such op a DQ -> op -> Q group, which is
  also what ONNX Runtime fuses into its integer kernels (runtime/sim_kernels.py). A graph output
  stays float. A MaxPool's output keeps its input's scale: max commutes with quantization, so no
  rounding is added.
- a tensor quantized for one reader is read through its Q/DQ by every reader (graph outputs
  excepted): a residual Add sees the int8 values the conv next to it sees.
A pass that leaves any of those ops without quantized inputs raises `QuantizationError`: a float
artifact must never be shipped silently in place of an int8 one.

Precision per activation tensor (`precision`: tensor -> one of `targets.PRECISIONS`): an int16
tensor gets an int16 Q/DQ pair (zero point 0, scale = the int8 threshold / 32767: the same range
with 258x finer steps; QuantizeLinear takes int16 from opset 21, which the graph then declares);
a `dual_int16` tensor too, and the Conv / Gemm / MatMul reading it gets int16 per-channel
weights (max|w_c| / 32767); a float tensor none at all (the op reading it runs in float: on the
CPU, as hbdk4 lowers it). Which marches take which is `torch_fl/targets.py`'s table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from torch_fl.bpu.conversion.export import constant_names
from torch_fl.bpu.errors import QuantizationError
from torch_fl.targets import PRECISIONS


class WeightSlots(NamedTuple):
    """Where a quantized-weight op reads its weight, and its bias (None: it has none)."""

    weight: int
    bias: int | None


# The one table of ops whose weights are quantized per channel (their biases to int32): the Q/DQ
# pass here and the live-weights graph (live_weights.make_live) rewire the same slots.
QUANTIZED_WEIGHT_OPS: dict[str, WeightSlots] = {
    "Conv": WeightSlots(1, 2),
    "Gemm": WeightSlots(1, 2),
    "MatMul": WeightSlots(1, None),
}
WEIGHT_OPS = {op: slots.weight for op, slots in QUANTIZED_WEIGHT_OPS.items()}
"""op -> index of the weight input (the view of `QUANTIZED_WEIGHT_OPS` most readers need)."""
POOL_OPS = ("MaxPool", "AveragePool", "GlobalAveragePool")
QUANT_OPS = tuple(WEIGHT_OPS) + POOL_OPS
QMAX = 127
QMAX16 = 32767
INT16_OPSET = 21  # the first opset whose QuantizeLinear / DequantizeLinear take int16
WIDE = ("int16", "dual_int16")
"""Precisions whose activation Q/DQ pair is int16; `dual_int16` also quantizes the weights of
the Conv / Gemm / MatMul reading the tensor to int16 per channel (HMCT's "dual int16")."""


def is_wide(precision: str | None) -> bool:
    """Whether a tensor of this precision is read through an int16 Q/DQ pair."""
    return precision in WIDE


# Largest |int32 bias| allowed: the int32 accumulator must still hold the bias plus the sum of
# int8 products (K x 127 x 127 < 2^30 for every K below 66k).
BIAS_QMAX = 2**30


def per_channel_scales(
    weight: np.ndarray, axis: int, floor: np.ndarray | None = None, qmax: int = QMAX
) -> np.ndarray:
    """Symmetric per-channel scales: max |w| over every axis but `axis`, divided by `qmax` (127;
    32767 for int16 weights), and at least `floor` per channel where one is given
    (`bias_floor`)."""
    reduce_axes = tuple(i for i in range(weight.ndim) if i != axis)
    amax = np.abs(weight).max(axis=reduce_axes) if reduce_axes else np.abs(weight)
    scales = amax.astype(np.float32) / np.float32(qmax)
    # An all-zero channel would divide by zero; any scale represents zeros exactly.
    scales = np.where(scales > 0, scales, np.float32(1.0)).astype(np.float32)
    if floor is not None:
        scales = np.maximum(scales, floor.astype(np.float32).reshape(scales.shape))
    return scales


def bias_floor(bias: np.ndarray, act_scale: float) -> np.ndarray:
    """Per output channel, the smallest weight scale at which the int32 bias holds `bias`
    (|b_c| / (act_scale x w_scale_c) <= BIAS_QMAX).

    Trained networks have dead channels: BatchNorm folds a near-zero running variance into
    weights of ~1e-8 beside an ordinary bias (EfficientNet-Lite's stem), and faded features give
    a tiny activation scale. At max|w|/127 such a bias leaves int32. Raising the activation scale
    instead (what this pass once did) coarsens every channel of the layer and every other reader
    of the tensor: one dead channel collapsed the whole network's output (cosine 0.12). Raising
    only that channel's weight scale costs nothing measurable: where the floor binds, the channel's
    weights contribute at most K x 127 / (2 x 2^30) of its bias in rounding error."""
    need = np.abs(bias.astype(np.float64)) / (float(act_scale) * BIAS_QMAX)
    # float32 rounding of act x w_scale must not push |b| / scale past BIAS_QMAX
    return (need * (1 + 2**-20)).astype(np.float32)


def quantize_weight(
    weight: np.ndarray, axis: int, floor: np.ndarray | None = None, wide: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """int8 weight and its per-channel scales (along `axis`, at least `floor`); `wide`: int16
    (max |w_c| / 32767), the weights of a layer whose input is `dual_int16`."""
    qmax, dtype = (QMAX16, np.int16) if wide else (QMAX, np.int8)
    scales = per_channel_scales(weight, axis, floor, qmax)
    shape = [1] * weight.ndim
    shape[axis] = -1
    q = np.clip(np.rint(weight / scales.reshape(shape)), -qmax, qmax).astype(dtype)
    return q, scales


def _clamps(node: onnx.NodeProto, inits: set[str]) -> bool:
    """A Relu, or a Clip whose bounds are constants: monotone, so quantizing after it equals
    clamping the quantized values (what the BPU does in its output stage)."""
    if node.op_type == "Relu":
        return True
    return node.op_type == "Clip" and all(not n or n in inits for n in node.input[1:])


def requant_points(model: onnx.ModelProto) -> list[str]:
    """Tensors quantized where a weight op's result ends: its output, or the output of its Relu
    or constant-bound Clip (ReLU6) when that is the output's only reader. Quantizing after the
    clamp matters: a ReLU6 conv quantized before it spends its 127 levels on a range the clamp
    throws away (MobileNetV2 lost most of its accuracy that way). Graph outputs and activation x
    activation MatMuls (attention scores) stay float."""
    graph = model.graph
    inits = {i.name for i in graph.initializer}
    constants = constant_names(model)
    outputs = {o.name for o in graph.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    points: list[str] = []
    for node in graph.node:
        widx = WEIGHT_OPS.get(node.op_type)
        if widx is None or len(node.input) <= widx or node.input[widx] not in inits:
            continue
        end = node.output[0]
        users = readers.get(end, [])
        if len(users) == 1 and _clamps(users[0], constants) and end not in outputs:
            end = users[0].output[0]
        if end not in outputs and end not in points:
            points.append(end)
    return points


def activation_inputs(model: onnx.ModelProto) -> list[str]:
    """Names of the activation tensors that get a Q/DQ pair (what calibration must observe)."""
    inits = {i.name for i in model.graph.initializer}
    names: list[str] = []
    for node in model.graph.node:
        for name in _act_inputs(node, inits):
            if name not in names:
                names.append(name)
    for name in requant_points(model):
        if name not in names:
            names.append(name)
    return names


def effective_scales(
    model: onnx.ModelProto, act_scales: Mapping[str, float], default_scale: float
) -> dict[str, float]:
    """The activation scales the Q/DQ pass uses: a MaxPool's output takes its input's scale (in
    graph order, so chains follow). The live-weights graph quantizes its biases with these too."""
    scales = {k: float(v) for k, v in act_scales.items()}
    for node in model.graph.node:
        if node.op_type == "MaxPool" and len(node.output) == 1:
            scales[node.output[0]] = scales.get(node.input[0], default_scale)
    return scales


def input_scale(
    name: str,
    act_scales: Mapping[str, float],
    default_scale: float,
    precision: Mapping[str, str] | None,
) -> float:
    """The scale a quantized op's input `name` is read at: int16 steps are 258x finer."""
    scale = float(act_scales.get(name, default_scale))
    if is_wide((precision or {}).get(name)):
        return scale * QMAX / QMAX16
    return scale


def _act_inputs(node: onnx.NodeProto, inits: set[str]) -> list[str]:
    if node.op_type in POOL_OPS or node.op_type == "Conv":
        return [node.input[0]]
    if node.op_type in ("Gemm", "MatMul"):
        return [name for name in node.input[:2] if name and name not in inits]
    return []


def _weight_axis(node: onnx.NodeProto, weight: np.ndarray) -> int | None:
    if node.op_type == "Conv":
        return 0
    if weight.ndim != 2:
        return None  # batched constant matmul: per-tensor
    if node.op_type == "Gemm":
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        return 0 if attrs.get("transB", 0) else 1
    return 1  # MatMul: [K, N], output channel is the last axis


class _QdqGraph:
    """The new nodes and initializers of one Q/DQ pass, and the bookkeeping between them."""

    def __init__(
        self,
        graph: onnx.GraphProto,
        act_scales: Mapping[str, float],
        default_scale: float,
        precision: Mapping[str, str] | None = None,
    ) -> None:
        self.act_scales = act_scales
        self.default_scale = default_scale
        self.precision = dict(precision or {})
        self.inits = {i.name: i for i in graph.initializer}
        self.init_users: dict[str, int] = {}
        for node in graph.node:
            for name in node.input:
                if name in self.inits:
                    self.init_users[name] = self.init_users.get(name, 0) + 1
        self.nodes: list[onnx.NodeProto] = []
        self.new_inits: list[TensorProto] = []
        self.dq_of: dict[str, str] = {}  # activation tensor -> its dequantized name
        self.remove: set[str] = set()
        self.requant: set[str] = set()
        self.quantized: set[str] = set()  # every tensor that gets a Q/DQ pair

    def scalar(self, name: str, value, dtype) -> None:
        self.new_inits.append(numpy_helper.from_array(np.array(value, dtype=dtype), name))

    def _release(self, name: str) -> None:
        """One reader of initializer `name` now reads its quantized copy."""
        self.init_users[name] -= 1
        if self.init_users[name] == 0:
            self.remove.add(name)

    def _pair(self, name: str, source: str, dq: str) -> None:
        """Q/DQ of tensor `name` (read from `source`, dequantized into `dq`)."""
        scale = float(self.act_scales.get(name, self.default_scale))
        if not scale > 0 or not np.isfinite(scale):
            raise QuantizationError(f"activation scale for {name!r} is {scale}; need > 0")
        wide = is_wide(self.precision.get(name))
        self.scalar(f"{name}_scale", scale * QMAX / QMAX16 if wide else scale, np.float32)
        self.scalar(f"{name}_zero_point", 0, np.int16 if wide else np.int8)
        q = f"{name}_quantized"
        args = [f"{name}_scale", f"{name}_zero_point"]
        self.nodes.append(helper.make_node("QuantizeLinear", [source, *args], [q], f"{name}_Q"))
        self.nodes.append(helper.make_node("DequantizeLinear", [q, *args], [dq], f"{name}_DQ"))
        self.dq_of[name] = dq

    def act_dq(self, name: str) -> str:
        """The dequantized name of activation `name` (one Q/DQ pair per tensor; a tensor kept
        in float is read as it is)."""
        if self.precision.get(name) == "float":
            return name
        if name not in self.dq_of:
            self._pair(name, name, f"{name}_dequantized")
        return self.dq_of[name]

    def requantize_outputs(self, node: onnx.NodeProto) -> None:
        """Quantize the outputs of `node` that are requantization points in place: the node
        writes `<name>_float`, and every reader of `name` reads the dequantized value."""
        for i, name in enumerate(node.output):
            if self.precision.get(name) == "float":
                continue
            if name in self.requant and name not in self.dq_of:
                node.output[i] = f"{name}_float"
                self._pair(name, node.output[i], name)

    def weight_dq(
        self, node: onnx.NodeProto, wname: str, bname: str | None = None
    ) -> tuple[str, np.ndarray]:
        """Int8 per-channel (or per-tensor) copy of weight `wname` (int16 per channel where the
        op's input is `dual_int16`): (dequantized name, scales); with the constant bias `bname`
        beside it, each channel's scale is raised where the int32 bias would not hold that bias
        (`bias_floor`)."""
        weight = numpy_helper.to_array(self.inits[wname]).astype(np.float32)
        axis = _weight_axis(node, weight)
        if axis is None:
            q = weight.reshape(1, -1)
            qw, scales = quantize_weight(q, 0)
            qw, scales = qw.reshape(weight.shape), scales.reshape(())
        else:
            floor = None
            if bname is not None:
                bias = numpy_helper.to_array(self.inits[bname])
                if bias.shape == (weight.shape[axis],):
                    act = input_scale(
                        node.input[0], self.act_scales, self.default_scale, self.precision
                    )
                    floor = bias_floor(bias, act)
            dual = self.precision.get(node.input[0]) == "dual_int16"
            qw, scales = quantize_weight(weight, axis, floor, wide=dual)
        base = f"{node.name or wname}_{wname}"
        self.new_inits.append(numpy_helper.from_array(qw, f"{base}_quantized"))
        self.scalar(f"{base}_scale", scales, np.float32)
        self.scalar(f"{base}_zero_point", np.zeros(scales.shape, qw.dtype), qw.dtype)
        dq_args = [f"{base}_quantized", f"{base}_scale", f"{base}_zero_point"]
        axis_attr = {"axis": axis} if scales.ndim else {}
        self.nodes.append(
            helper.make_node(
                "DequantizeLinear", dq_args, [f"{base}_dequantized"], f"{base}_DQ", **axis_attr
            )
        )
        self._release(wname)
        return f"{base}_dequantized", scales

    def bias_dq(self, node: onnx.NodeProto, bname: str, scales: np.ndarray) -> str | None:
        """Int32 bias at activation scale x weight scale_c; None when its shape does not fit."""
        bias = numpy_helper.to_array(self.inits[bname]).astype(np.float64)
        if bias.shape != scales.shape:
            return None
        act_scale = input_scale(node.input[0], self.act_scales, self.default_scale, self.precision)
        bscale = (scales.astype(np.float64) * act_scale).astype(np.float32)
        # clipped, never wrapped (the weight scales' bias floor makes the clip a no-op)
        qb = np.clip(np.rint(bias / bscale), -BIAS_QMAX, BIAS_QMAX).astype(np.int32)
        bbase = f"{node.name or bname}_{bname}"
        self.new_inits.append(numpy_helper.from_array(qb, f"{bbase}_quantized"))
        self.scalar(f"{bbase}_scale", bscale, np.float32)
        self.scalar(f"{bbase}_zero_point", np.zeros(bscale.shape, np.int32), np.int32)
        self.nodes.append(
            helper.make_node(
                "DequantizeLinear",
                [f"{bbase}_quantized", f"{bbase}_scale", f"{bbase}_zero_point"],
                [f"{bbase}_dequantized"],
                f"{bbase}_DQ",
                axis=0,
            )
        )
        self._release(bname)
        return f"{bbase}_dequantized"

    def rewrite(self, node: onnx.NodeProto) -> None:
        """Append `node`, its quantizable inputs read through Q/DQ, after their DQ nodes."""
        if node.op_type not in QUANT_OPS:
            # a tensor that is quantized for one reader is read quantized by all (a residual
            # Add reads the same int8 values as the conv beside it, as on the BPU)
            for i, name in enumerate(node.input):
                if name in self.quantized:
                    node.input[i] = self.act_dq(name)
            self.nodes.append(node)
            self.requantize_outputs(node)
            return
        acts = _act_inputs(node, set(self.inits))
        inputs = list(node.input)
        for i, name in enumerate(inputs):
            if name in acts:
                inputs[i] = self.act_dq(name)
        widx = WEIGHT_OPS.get(node.op_type)
        if self.precision.get(node.input[0]) == "float":
            widx = None  # the op runs in float (on the CPU): its weights stay float too
        if widx is not None and inputs[widx] in self.inits:
            bidx = QUANTIZED_WEIGHT_OPS[node.op_type].bias
            quantized_bias = (
                bidx is not None
                and len(inputs) > bidx
                and inputs[bidx] in self.inits
                and node.input[0] in self.dq_of
            )
            bname = inputs[bidx] if quantized_bias else None
            inputs[widx], scales = self.weight_dq(node, inputs[widx], bname)
            if bname is not None and scales.ndim == 1:
                inputs[bidx] = self.bias_dq(node, bname, scales) or bname
        elif widx is not None and node.op_type == "Conv":
            raise QuantizationError(
                f"Conv {node.name!r}: weight {inputs[widx]!r} is not a constant, so it cannot be "
                "quantized per channel. Fix: make the weight a parameter/buffer of the module, "
                "or compile with options={'quantize': False} for a float artifact."
            )
        del node.input[:]
        node.input.extend(inputs)
        self.nodes.append(node)
        self.requantize_outputs(node)


def quantize_model(
    model: onnx.ModelProto,
    act_scales: Mapping[str, float],
    default_scale: float,
    precision: Mapping[str, str] | None = None,
) -> onnx.ModelProto:
    """Return a Q/DQ copy of `model` (float ONNX from `export_onnx`); `precision` names the
    activation tensors kept in int16 or float (all others int8)."""
    precision = {k: v for k, v in (precision or {}).items() if v != "int8"}
    bad = sorted({v for v in precision.values() if v not in PRECISIONS})
    if bad:
        raise QuantizationError(f"precision must be one of {PRECISIONS}, not {bad}")
    if any(is_wide(v) for v in precision.values()):
        model = _at_int16_opset(model)
    act_scales = effective_scales(model, act_scales, default_scale)
    model_q = onnx.ModelProto()
    model_q.CopyFrom(model)
    graph = model_q.graph
    qdq = _QdqGraph(graph, act_scales, default_scale, precision)
    qdq.requant = set(requant_points(model))
    qdq.quantized = set(activation_inputs(model))
    for node in graph.node:
        qdq.rewrite(node)
    del graph.node[:]
    graph.node.extend(qdq.nodes)
    kept = [i for i in graph.initializer if i.name not in qdq.remove]
    del graph.initializer[:]
    graph.initializer.extend(kept + qdq.new_inits)
    verify_quantized(model_q, {k for k, v in precision.items() if v == "float"})
    return model_q


def add_to_biases(model: onnx.ModelProto, deltas: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of float `model` whose bias initializers named in `deltas` have it added."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for init in out.graph.initializer:
        if init.name in deltas:
            bias = numpy_helper.to_array(init).astype(np.float32)
            delta = np.asarray(deltas[init.name], np.float32)
            if delta.size == bias.size:  # a delta of another graph is not applied
                init.CopyFrom(numpy_helper.from_array(bias + delta.reshape(bias.shape), init.name))
    return out


def _at_int16_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """The float graph converted to INT16_OPSET (ONNX's own version converter: the same
    results), so its Q/DQ pairs may be int16."""
    from onnx import version_converter

    current = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if current >= INT16_OPSET:
        return model
    try:
        return version_converter.convert_version(model, INT16_OPSET)
    except Exception as exc:  # noqa: BLE001  (the converter raises plain exceptions)
        raise QuantizationError(
            f"int16 needs opset {INT16_OPSET} (QuantizeLinear with int16) and this graph does "
            f"not convert from opset {current} ({type(exc).__name__}: {exc}). Fix: keep these "
            "tensors int8, or float with options={'float': [...]}"
        ) from exc


def verify_quantized(model: onnx.ModelProto, float_ok: set[str] = frozenset()) -> None:
    """Every quantizable op must read only dequantized (or constant bias) inputs, but for the
    tensors the caller chose to keep in float (`float_ok`)."""
    produced_by = {out: node.op_type for node in model.graph.node for out in node.output}
    problems = []
    for node in model.graph.node:
        if node.op_type not in QUANT_OPS:
            continue
        if node.input and node.input[0] in float_ok:
            continue  # chosen to run in float, weights included
        n_checked = 1 if node.op_type in POOL_OPS else 2
        for name in node.input[:n_checked]:
            if name in float_ok:
                continue
            if produced_by.get(name) != "DequantizeLinear":
                problems.append(f"{node.op_type} {node.name!r} input {name!r}")
    if problems:
        raise QuantizationError(
            "Q/DQ pass left float inputs (the artifact would run on the CPU, not the BPU): "
            + "; ".join(problems)
            + ". Fix: report the partition, or compile with options={'quantize': False} to accept "
            "a float artifact explicitly."
        )
    onnx.checker.check_model(model)

"""The BPU op-support table and the per-node decision, with a reason for every rejection.

Reasons are what the coverage report and strict mode print, so each one names the cause:
unsupported op, dtype, symbolic shape, tuple boundary (and, decided later by the partitioner,
below minimum size).
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Mapping

import torch
from torch import fx
from torch.fx.passes.operator_support import OperatorSupportBase

aten = torch.ops.aten

# kind -> op packets. Kinds other than "shape" count as compute in the coverage percentage.
_TABLE: dict[str, tuple] = {
    "conv": (aten.convolution,),
    "gemm": (aten.addmm, aten.mm, aten.bmm, aten.linear, aten.matmul, aten.baddbmm),
    "norm": (aten.batch_norm, aten.layer_norm, aten.group_norm),
    "activation": (
        aten.relu,
        aten.gelu,
        aten.silu,
        aten.sigmoid,
        aten.tanh,
        aten.hardtanh,
        aten.hardswish,
        aten.hardsigmoid,
        aten.leaky_relu,
        aten.elu,
        aten.clamp,
        aten.clamp_min,
        aten.clamp_max,
        aten.softplus,
        aten.mish,
    ),  # fmt: skip
    "pool": (aten.max_pool2d, aten.avg_pool2d, aten.adaptive_avg_pool2d, aten._adaptive_avg_pool2d),
    "elementwise": (
        aten.add,
        aten.sub,
        aten.rsub,
        aten.mul,
        aten.div,
        aten.neg,
        aten.rsqrt,
        aten.sqrt,
        aten.pow,
        aten.exp,
        aten.abs,
        aten.reciprocal,
        aten.maximum,
        aten.minimum,
        aten.mean,
        aten.sum,
        aten.amax,
        aten.erf,
        aten.log,
        aten.sin,
        aten.cos,
        aten.linalg_vector_norm,
    ),  # fmt: skip
    "softmax": (aten.softmax, aten.log_softmax),
    "resample": (aten.upsample_bilinear2d, aten.upsample_nearest2d),
    "select": (aten.where, aten.masked_fill),
    "gather": (aten.index, aten.index_select, aten.gather, aten.embedding),
    "cast": (aten.to,),
    "shape": (
        aten.view,
        aten.reshape,
        aten.permute,
        aten.transpose,
        aten.unsqueeze,
        aten.squeeze,
        aten.flatten,
        aten.cat,
        aten.slice,
        aten.expand,
        aten.clone,
        aten.alias,
        aten.select,
        aten.t,
        aten.roll,
        aten.constant_pad_nd,
        aten.repeat,
        aten.stack,
        aten.flip,
        aten.pixel_shuffle,
    ),  # fmt: skip
}
_KIND_OF: dict = {packet: kind for kind, packets in _TABLE.items() for packet in packets}
COMPUTE_KINDS = frozenset(kind for kind in _TABLE if kind != "shape")
SUPPORTED_DTYPES = (torch.float32,)
# Ops that read integer indices or a boolean condition/mask next to their float data.
_INDEX_INPUT_KINDS = {"select", "gather", "cast"}
_INDEX_DTYPES = (torch.int64, torch.int32, torch.bool)


def op_kind(node: fx.Node) -> str | None:
    """Table kind of a call_function node (None: not in the table)."""
    if node.op != "call_function":
        return None
    packet = getattr(node.target, "overloadpacket", None)
    return _KIND_OF.get(packet)


def is_compute(node: fx.Node) -> bool:
    """Compute node for coverage: any call_function except pure shape ops and getitem."""
    if node.op != "call_function" or node.target is operator.getitem:
        return False
    return op_kind(node) != "shape"


def _has_symbolic(value) -> bool:
    if isinstance(value, torch.Tensor):
        return any(not isinstance(d, int) for d in value.shape)
    if isinstance(value, torch.SymInt | torch.SymFloat):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_symbolic(v) for v in value)
    return False


def _export_problem(node: fx.Node) -> str | None:
    """Argument forms of supported ops that do not export to ONNX (decided before partitioning,
    so an accepted partition always exports)."""
    if node.target is aten.to.dtype and (len(node.args) != 2 or node.args[1] is not torch.float32):
        return "export: only casts to float32 run in a partition"
    if node.target in (aten._adaptive_avg_pool2d.default, aten.adaptive_avg_pool2d.default):
        from torch_fl.bpu.lowering.rewrites import adaptive_pool_window

        if adaptive_pool_window(node) is None:
            return (
                "export: adaptive_avg_pool2d to a size that does not divide its input exports only "
                "as a global pool; feed an input whose height/width are multiples of the output"
            )
    if node.target is aten.index.Tensor:
        indices = [i for i in node.args[1] if i is not None]
        vals = [i.meta.get("val") if isinstance(i, fx.Node) else None for i in indices]
        if len(indices) != 1 or not all(
            isinstance(v, torch.Tensor) and v.dtype in (torch.int64, torch.int32) for v in vals
        ):
            return "export: only indexing with one integer index tensor exports (as Gather)"
    return None


# Non-float ops accepted when they read only weights/buffers/constants: their values are part of
# the artifact (evaluated into initializers from the weights), not per-call integer work.
_WEIGHT_DERIVED_OK = {
    aten.eq, aten.ne, aten.lt, aten.le, aten.gt, aten.ge,
    aten.logical_not, aten.logical_and, aten.logical_or, aten.bitwise_not,
}  # fmt: skip


def weight_derived(gm: fx.GraphModule, frozen_inputs: Collection[fx.Node]) -> set[fx.Node]:
    """Nodes whose value depends only on `frozen_inputs`, get_attr constants and literals."""
    derived: set[fx.Node] = set()
    frozen = set(frozen_inputs)
    for node in gm.graph.nodes:
        if node.op == "get_attr" or node in frozen:
            derived.add(node)
        elif node.op == "call_function" and node.all_input_nodes:
            if all(i in derived for i in node.all_input_nodes):
                derived.add(node)
    return derived


def rejection_reason(node: fx.Node, derived: Collection[fx.Node] = ()) -> str | None:
    """Why `node` cannot run on the BPU, or None if it can."""
    if node.target is operator.getitem:
        producer = node.args[0]
        name = getattr(producer, "name", "?")
        return f"tuple boundary: reads an output of {name}, which stays on the CPU"
    val = node.meta.get("val")
    if isinstance(val, (tuple, list)):
        used = sorted(
            {u.args[1] for u in node.users if u.target is operator.getitem and len(u.args) > 1}
        )
        if used == [0]:  # the extra outputs are unused: the op itself is the problem
            return (
                f"unsupported op: {node.target} (a fused kernel the lowering could not "
                "decompose with these arguments)"
            )
        return f"tuple boundary: {node.target} returns {len(val)} outputs, outputs {used} are used"
    packet = getattr(node.target, "overloadpacket", None)
    if node in derived and packet in _WEIGHT_DERIVED_OK and isinstance(val, torch.Tensor):
        if not _has_symbolic(val):
            return None
    kind = op_kind(node)
    if kind is None:
        return f"unsupported op: {node.target}"
    if not isinstance(val, torch.Tensor):
        return f"unsupported op: {node.target} produces no tensor"
    if _has_symbolic(val) or any(_has_symbolic(a) for a in node.args):
        return "symbolic shape: the BPU needs static shapes (compile with dynamic=False)"
    export_problem = _export_problem(node)
    if export_problem is not None:
        return export_problem
    if val.dtype not in SUPPORTED_DTYPES and not (node in derived and kind == "shape"):
        return f"dtype: output is {val.dtype}, the BPU path takes float32"
    for arg in node.all_input_nodes:
        aval = arg.meta.get("val")
        if isinstance(aval, torch.Tensor) and aval.dtype not in SUPPORTED_DTYPES:
            if kind in _INDEX_INPUT_KINDS and aval.dtype in _INDEX_DTYPES:
                continue
            if arg in derived and kind == "shape":
                continue  # slicing/reshaping a weight-derived mask
            return f"dtype: input {arg.name} is {aval.dtype}, the BPU path takes float32"
        if _has_symbolic(aval):
            return "symbolic shape: the BPU needs static shapes (compile with dynamic=False)"
    return None


class BpuOperatorSupport(OperatorSupportBase):
    """OperatorSupport for CapabilityBasedPartitioner that remembers why it said no."""

    def __init__(self, derived: Collection[fx.Node] = ()) -> None:
        super().__init__()
        self.reasons: dict[fx.Node, str] = {}
        self.derived = derived

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module], node: fx.Node) -> bool:
        if node.op != "call_function":
            return False
        reason = rejection_reason(node, self.derived)
        if reason is not None:
            self.reasons[node] = reason
            return False
        return True

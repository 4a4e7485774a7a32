"""Rewrite ops the BPU path cannot carry into equivalent single-output, exportable ops.

Two kinds of trouble come out of aot_autograd:
- tuple-returning ops whose extra outputs nobody uses (`_native_batch_norm_legit_no_training`,
  `native_layer_norm`, `max_pool2d_with_indices`, `split` read piecewise -> slices): a tuple output is a partition boundary the
  BPU cannot express, and left alone it split ResNet-18 in two in the earlier backend;
- ops the ONNX exporter has no symbolic for (`_softmax`, `_unsafe_view`, 2-D `t`), and `view`,
  which the exporter re-runs on real strides (a `view` of a permuted tensor fails there, although
  the graph is valid: the functional graph has no strides to respect, so `reshape` is the same).
Fused attention/transformer kernels are decomposed first (`decompose`), then input-independent
subgraphs are folded (`constants`). Each rewrite is semantically exact; a tuple op whose extra
output is really used stays as it is.

Each rewrite is one function registered in `REWRITES` (lowering/registry.py) for the op(s) it
handles, with the name `apply_rewrites` counts it under; `_rewrite` only looks the op up.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Callable

import torch
from torch import fx

from torch_fl.bpu.lowering.constants import fold_constants
from torch_fl.bpu.lowering.decompose import decompose
from torch_fl.bpu.lowering.registry import PassRegistry
from torch_fl.bpu.lowering.resize import to_aten as resize_to_aten

aten = torch.ops.aten

Rewrite = Callable[[fx.Graph, fx.Node], bool]
"""A rewrite pass: change `node` (in `graph`) in place and say True, or decline with False."""

REWRITES: PassRegistry[Rewrite] = PassRegistry("rewrite")
"""Every rewrite, by the op it handles (`_rewrite` looks nodes up here)."""


# Binary ops called with a Python number: the TorchScript exporter cannot trace the `.Tensor`
# overload with a scalar operand, the `.Scalar` overload is the same math.
_SCALAR_OVERLOADS = {
    aten.add.Tensor: aten.add.Scalar,
    aten.sub.Tensor: aten.sub.Scalar,
    aten.mul.Tensor: aten.mul.Scalar,
    aten.div.Tensor: aten.div.Scalar,
}


def _only_first_output_used(node: fx.Node) -> list[fx.Node] | None:
    """The getitem[0] users of a tuple node, or None if anything else reads the tuple."""
    firsts = []
    for user in node.users:
        if user.op != "call_function" or user.target is not operator.getitem:
            return None
        if user.args[1] != 0:
            return None
        firsts.append(user)
    return firsts


def _replace_tuple_op(graph: fx.Graph, node: fx.Node, target, args: tuple) -> bool:
    firsts = _only_first_output_used(node)
    if firsts is None:
        return False
    with graph.inserting_before(node):
        new = graph.call_function(target, args)
    if firsts:
        new.meta.update(firsts[0].meta)
    elif "val" in node.meta and isinstance(node.meta["val"], (tuple, list)):
        new.meta["val"] = node.meta["val"][0]
    for user in firsts:
        user.replace_all_uses_with(new)
        graph.erase_node(user)
    graph.erase_node(node)
    return True


@REWRITES.register(aten.split.Tensor, aten.split_with_sizes.default, name="split")
def _split_to_slices(graph: fx.Graph, node: fx.Node) -> bool:
    """split/split_with_sizes read only through getitem -> one slice per piece (no tuple)."""
    x = node.args[0]
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
    val = x.meta.get("val") if isinstance(x, fx.Node) else None
    if not isinstance(val, torch.Tensor) or not isinstance(val.shape[dim], int):
        return False
    users = list(node.users)
    if any(u.op != "call_function" or u.target is not operator.getitem for u in users):
        return False
    length = val.shape[dim]
    if node.target is aten.split.Tensor:
        size = node.args[1]
        sizes = [min(size, length - start) for start in range(0, length, size)]
    else:
        sizes = list(node.args[1])
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    for user in users:
        i = user.args[1]
        with graph.inserting_before(user):
            piece = graph.call_function(
                aten.slice.Tensor, (x, dim, starts[i], starts[i] + sizes[i], 1)
            )
        piece.meta.update(user.meta)
        user.replace_all_uses_with(piece)
        graph.erase_node(user)
    graph.erase_node(node)
    return True


@REWRITES.register(aten.unbind.int, name="unbind")
def _unbind_to_selects(graph: fx.Graph, node: fx.Node) -> bool:
    """unbind read only through getitem -> one select per piece (no tuple)."""
    users = list(node.users)
    if any(u.op != "call_function" or u.target is not operator.getitem for u in users):
        return False
    x = node.args[0]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    for user in users:
        with graph.inserting_before(user):
            piece = graph.call_function(aten.select.int, (x, dim, user.args[1]))
        piece.meta.update(user.meta)
        user.replace_all_uses_with(piece)
        graph.erase_node(user)
    graph.erase_node(node)
    return True


def _static_val(node) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if isinstance(val, torch.Tensor) and all(isinstance(d, int) for d in val.shape):
        return val
    return None


@REWRITES.register(aten.as_strided.default, name="as_strided_permute")
def _as_strided_to_permute(graph: fx.Graph, node: fx.Node) -> bool:
    """as_strided of a contiguous tensor that only reorders its dims -> permute."""
    x, size, stride = node.args[:3]
    offset = node.args[3] if len(node.args) > 3 else node.kwargs.get("storage_offset")
    val = _static_val(x)
    if val is None or offset not in (None, 0) or not val.is_contiguous():
        return False
    shape, strides = list(val.shape), list(val.stride())
    if len(size) != len(shape):
        return False
    order = []
    for dim_size, dim_stride in zip(size, stride, strict=True):
        matches = [
            i
            for i in range(len(shape))
            if i not in order
            and shape[i] == dim_size
            and (strides[i] == dim_stride or dim_size == 1)
        ]
        if not matches:
            return False
        order.append(matches[0])
    node.target = aten.permute.default
    node.args = (x, order)
    node.kwargs = {}
    return True


@REWRITES.register(aten.slice_scatter.default, name="slice_scatter")
def _slice_scatter_to_cat(graph: fx.Graph, node: fx.Node) -> bool:
    """slice_scatter(x, src, dim, start, end, 1) -> cat(x[..:start], src, x[end:..]) on dim."""
    names = ("input", "src", "dim", "start", "end", "step")
    values = dict(zip(names, node.args, strict=False))
    values.update(node.kwargs)
    val = _static_val(values["input"])
    if val is None or values.get("step", 1) != 1:
        return False
    dim = values.get("dim", 0) % val.dim()
    length = val.shape[dim]
    start = values.get("start") or 0
    end = values.get("end")
    end = length if end is None else min(end, length)
    start, end = (start + length if start < 0 else start), (end + length if end < 0 else end)
    if not (0 <= start <= end <= length):
        return False
    x, src = values["input"], values["src"]
    pieces = []
    with graph.inserting_before(node):
        if start > 0:
            pieces.append(graph.call_function(aten.slice.Tensor, (x, dim, 0, start, 1)))
        pieces.append(src)
        if end < length:
            pieces.append(graph.call_function(aten.slice.Tensor, (x, dim, end, length, 1)))
    for piece in pieces:
        if piece is not src:
            low, high = piece.args[2], piece.args[3]
            piece.meta["val"] = val.narrow(dim, low, high - low)
    node.target = aten.cat.default
    node.args = (pieces, dim)
    node.kwargs = {}
    return True


def _rank(node: fx.Node) -> int | None:
    val = node.meta.get("val")
    return val.dim() if isinstance(val, torch.Tensor) else None


def adaptive_pool_window(node: fx.Node) -> tuple[int, int] | None | str:
    """The (kh, kw) of the avg_pool2d an adaptive_avg_pool2d node equals; "global" for output
    1x1 (ONNX GlobalAveragePool); None when the input is not a multiple of the output."""
    x, size = node.args[0], node.args[1]
    val = x.meta.get("val") if isinstance(x, fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() < 3:
        return None
    h, w = val.shape[-2:]
    size = [size, size] if isinstance(size, int) else list(size)
    out = [h if size[0] is None else size[0], w if size[-1] is None else size[-1]]
    if not all(isinstance(v, int) and v > 0 for v in (h, w, *out)):
        return None
    if out == [1, 1]:
        return "global"
    if h % out[0] or w % out[1]:
        return None
    return h // out[0], w // out[1]


@REWRITES.register(
    aten._adaptive_avg_pool2d.default, aten.adaptive_avg_pool2d.default, name="adaptive_avg_pool"
)
def _adaptive_to_avg_pool(graph: fx.Graph, node: fx.Node) -> bool:
    # the exporter turns only a global adaptive pool into ONNX; one whose input is a multiple
    # of its output (AlexNet's 6x6, VGG's 7x7 at 224) is a plain average pool
    window = adaptive_pool_window(node)
    if not isinstance(window, tuple):
        return False
    node.target = aten.avg_pool2d.default
    node.args = (node.args[0], list(window), list(window))
    return True


@REWRITES.register(aten.addcmul.default, name="addcmul")
def _addcmul_to_ops(graph: fx.Graph, node: fx.Node) -> bool:
    # a + value * b * c in elementwise ops the table takes (ConvNeXt-V2's GRN is an addcmul)
    a, b, c = node.args[:3]
    value = node.kwargs.get("value", node.args[3] if len(node.args) > 3 else 1)
    vals = [x.meta.get("val") if isinstance(x, fx.Node) else x for x in (a, b, c)]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return False
    with graph.inserting_before(node):
        prod = graph.call_function(aten.mul.Tensor, (b, c))
        prod.meta["val"] = vals[1] * vals[2]
        if value != 1:
            scaled = graph.call_function(aten.mul.Scalar, (prod, value))
            scaled.meta["val"] = prod.meta["val"] * value
            prod = scaled
        out = graph.call_function(aten.add.Tensor, (a, prod))
    out.meta.update(node.meta)
    node.replace_all_uses_with(out)
    graph.erase_node(node)
    return True


@REWRITES.register(aten._prelu_kernel.default, name="prelu")
def _prelu_to_relu(graph: fx.Graph, node: fx.Node) -> bool:
    # x if x > 0 else w * x  ==  relu(x) + w * min(x, 0), exactly (the other term is 0)
    x, weight = node.args
    xval = x.meta.get("val") if isinstance(x, fx.Node) else None
    with graph.inserting_before(node):
        pos = graph.call_function(aten.relu.default, (x,))
        neg = graph.call_function(aten.clamp_max.default, (x, 0.0))
        scaled = graph.call_function(aten.mul.Tensor, (neg, weight))
    pos.meta["val"] = neg.meta["val"] = xval
    scaled.meta["val"] = node.meta.get("val")
    node.target = aten.add.Tensor
    node.args = (pos, scaled)
    return True


@REWRITES.register(aten.copy.default, name="copy")
def _drop_same_shape_copy(graph: fx.Graph, node: fx.Node) -> bool:
    # functional copy(dst, src): the value is src (in dst's shape and dtype)
    dst, src = _static_val(node.args[0]), _static_val(node.args[1])
    if (
        dst is not None
        and src is not None
        and dst.shape == src.shape
        and dst.dtype == src.dtype
        and not node.kwargs.get("non_blocking")
    ):
        node.replace_all_uses_with(node.args[1])
        graph.erase_node(node)
        return True
    return False


def _to_copy_to_cast(node: fx.Node) -> bool:
    # the exporter has no symbolic for _to_copy; `to` with only a dtype is the same cast
    dtype = node.kwargs.get("dtype")
    val = node.meta.get("val")
    same_place = isinstance(val, torch.Tensor) and node.kwargs.get("device") in (None, val.device)
    if dtype is not None and same_place and node.kwargs.get("layout") in (None, torch.strided):
        node.target = aten.to.dtype
        node.args = (node.args[0], dtype)
        node.kwargs = {}
        return True
    return False


# -- the registered rewrites: one per pattern, looked up by the node's op ------------------------


@REWRITES.register(aten._native_batch_norm_legit_no_training.default, name="batch_norm")
def _batch_norm(graph: fx.Graph, node: fx.Node) -> bool:
    x, w, b, mean, var, momentum, eps = node.args
    args = (x, w, b, mean, var, False, momentum, eps, False)
    return _replace_tuple_op(graph, node, aten.batch_norm.default, args)


@REWRITES.register(aten.native_layer_norm.default, name="layer_norm")
def _layer_norm(graph: fx.Graph, node: fx.Node) -> bool:
    x, shape, w, b, eps = node.args
    return _replace_tuple_op(graph, node, aten.layer_norm.default, (x, shape, w, b, eps, False))


@REWRITES.register(aten.native_group_norm.default, name="group_norm")
def _group_norm(graph: fx.Graph, node: fx.Node) -> bool:
    x, w, b, _n, _c, _hw, groups, eps = node.args
    return _replace_tuple_op(graph, node, aten.group_norm.default, (x, groups, w, b, eps, False))


@REWRITES.register(aten.max_pool2d_with_indices.default, name="max_pool2d")
def _max_pool2d(graph: fx.Graph, node: fx.Node) -> bool:
    return _replace_tuple_op(graph, node, aten.max_pool2d.default, tuple(node.args))


def _keeps_dtype(node: fx.Node) -> bool:
    # half_to_float=True computes in float32 from a half input: no plain softmax does that
    return not node.args[2]


_PLAIN_SOFTMAX = {
    aten._softmax.default: aten.softmax.int,
    aten._log_softmax.default: aten.log_softmax.int,
}


@REWRITES.register(aten._softmax.default, name="softmax", validator=_keeps_dtype)
@REWRITES.register(aten._log_softmax.default, name="log_softmax", validator=_keeps_dtype)
def _plain_softmax(graph: fx.Graph, node: fx.Node) -> bool:
    x, dim, _half_to_float = node.args
    node.target = _PLAIN_SOFTMAX[node.target]
    node.args = (x, dim)
    return True


@REWRITES.register(aten._unsafe_view.default, aten.view.default, name="reshape")
def _view_to_reshape(graph: fx.Graph, node: fx.Node) -> bool:
    node.target = aten.reshape.default
    return True


def _only_cast_kwargs(node: fx.Node) -> bool:
    # memory_format, pin_memory, non_blocking: more than a cast, left to the partitioner
    return set(node.kwargs) <= {"dtype", "layout", "device"}


@REWRITES.register(aten._to_copy.default, name="cast", validator=_only_cast_kwargs)
def _cast(graph: fx.Graph, node: fx.Node) -> bool:
    return _to_copy_to_cast(node)


@REWRITES.register(torch.ops.torch_fl_bpu.resize.default, name="resize")
def _resize(graph: fx.Graph, node: fx.Node) -> bool:
    return resize_to_aten(node)


def _scalar_operand(node: fx.Node) -> bool:
    return len(node.args) > 1 and not isinstance(node.args[1], fx.Node)


@REWRITES.register(*_SCALAR_OVERLOADS, name="scalar_overload", validator=_scalar_operand)
def _scalar_overload(graph: fx.Graph, node: fx.Node) -> bool:
    node.target = _SCALAR_OVERLOADS[node.target]
    return True


def _is_matrix(node: fx.Node) -> bool:
    return _rank(node.args[0]) == 2


@REWRITES.register(aten.t.default, name="permute", validator=_is_matrix)
def _transpose_to_permute(graph: fx.Graph, node: fx.Node) -> bool:
    node.target = aten.permute.default
    node.args = (node.args[0], [1, 0])
    return True


def _rewrite(graph: fx.Graph, node: fx.Node) -> str | None:
    """Rewrite one node in place with the pass registered for its op; return the rewrite's
    name, or None (no pass for the op, its validator refused the node, or the pass declined)."""
    entry = REWRITES.find(node)
    if entry is not None and entry.fn(graph, node):
        return entry.name
    return None


def apply_rewrites(gm: fx.GraphModule) -> Counter:
    """Rewrite `gm` in place; return how many times each rewrite fired."""
    fired: Counter = Counter(decompose(gm))
    folded = fold_constants(gm)
    if folded:
        fired["constants_folded"] = folded
    for node in list(gm.graph.nodes):
        if node.op == "call_function":
            name = _rewrite(gm.graph, node)
            if name:
                fired[name] += 1
    if fired:
        # a rewrite can leave a producer without users (the dst of a copy); a dead node inside a
        # partition would make an input the ONNX export drops
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return fired

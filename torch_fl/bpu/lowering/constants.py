"""Compile-time folding of subgraphs that depend on no graph input at all.

Attention masks (causal, Swin's shifted-window regions), `arange` index arithmetic and similar
tensors are computed from shapes and literals only. Left in the graph they are int64/bool ops the
BPU does not take, so they ran on the CPU on every call and cut partitions. They are evaluated
once here, with real tensors, and replaced by one constant (a buffer of the graph module) per
value the rest of the graph reads; the backend passes those to partitions as frozen inputs, so
they become ONNX initializers.

Ops that read only an input's metadata (`x.new_zeros(shape)`, `zeros_like(x)`, `x.size(d)`)
count as input-independent too: torchvision's Swin builds its shifted-window mask from
`x.new_zeros((H, W))`, and its value depends on x's shape, dtype and device, never on x's data.
Shapes are static there (Dynamo guards on them and recompiles when they change), so the value is
computed from a stand-in tensor with the input's recorded metadata. Tensors with a symbolic shape
are never folded this way. `new_empty`/`empty_like` are not folded: their contents are
uninitialised, and a constant would fix one arbitrary value as if it were meaningful.

Subgraphs that read parameters or buffers are not folded here (their values are only known at
the first call and may change later): they stay in the partition, where the export pipeline
evaluates its weight-only part with the live weights.
"""

from __future__ import annotations

import torch
from torch import fx
from torch.utils._python_dispatch import _disable_current_modes

aten = torch.ops.aten

# Ops whose result depends on their first (tensor) argument's shape, dtype, device, layout and
# strides only, and on their other arguments. Uninitialised producers (new_empty, empty_like)
# are deliberately absent.
METADATA_ONLY = frozenset(
    {
        aten.new_zeros.default,
        aten.new_ones.default,
        aten.new_full.default,
        aten.zeros_like.default,
        aten.zero.default,  # functional zero_(): swin_v2 zeroes the key bias that way
        aten.ones_like.default,
        aten.full_like.default,
        aten.sym_size.int,
        aten.sym_numel.default,
    }
)

# Folding must not turn a small graph into a huge constant (e.g. a broadcast expanded to MBs).
MAX_FOLDED_BYTES = 16 << 20
PREFIX = "_bpu_folded_"


def _deterministic(node: fx.Node) -> bool:
    tags = getattr(node.target, "tags", ())
    return torch.Tag.nondeterministic_seeded not in tags


def _bytes(val) -> int:
    return val.numel() * val.element_size() if isinstance(val, torch.Tensor) else 0


def _static_meta(node) -> torch.Tensor | None:
    """The recorded value of `node` if it is a tensor with a fully static shape and strides."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if not isinstance(val, torch.Tensor):
        return None
    if not all(isinstance(d, int) for d in (*val.shape, *val.stride())):
        return None
    return val


def _metadata_source(node: fx.Node) -> fx.Node | None:
    """The tensor whose metadata (not data) a METADATA_ONLY node reads, if it has a static
    shape; None for every other node."""
    if node.target not in METADATA_ONLY or not node.args:
        return None
    source = node.args[0]
    return source if _static_meta(source) is not None else None


def _stand_in(node: fx.Node) -> torch.Tensor:
    """A real tensor with `node`'s recorded shape, strides, dtype and device. Its values are
    left uninitialised (and untouched pages cost no memory): METADATA_ONLY ops never read them."""
    val = _static_meta(node)
    if val is None:
        raise LookupError(f"{node.name} has no static metadata")
    return torch.empty_strided(
        tuple(val.shape), tuple(val.stride()), dtype=val.dtype, device=val.device
    )


def input_independent(gm: fx.GraphModule) -> set[fx.Node]:
    """call_function/get_attr nodes whose value depends on no placeholder's data (reading only a
    placeholder-derived tensor's static metadata is allowed)."""
    dependent: set[fx.Node] = set()
    constant: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            dependent.add(node)
        elif node.op == "get_attr":
            constant.add(node)
        elif node.op == "call_function":
            inputs = node.all_input_nodes
            source = _metadata_source(node)
            if source is not None:
                inputs = [i for i in inputs if i is not source]
            if any(i in dependent or i not in constant for i in inputs):
                dependent.add(node)
            elif _deterministic(node):
                constant.add(node)
            else:
                dependent.add(node)
    return constant


def _real(value):
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(value, FakeTensor):
        raise LookupError("fake constant")
    return value


def _inline_literal(node: fx.Node, value: int | float | bool) -> None:
    """Write `value` into every argument that read `node` (fx has no constant node for it)."""
    for user in list(node.users):
        user.args = fx.map_arg(user.args, lambda a: value if a is node else a)
        user.kwargs = fx.map_arg(user.kwargs, lambda a: value if a is node else a)


def fold_constants(gm: fx.GraphModule) -> int:
    """Fold input-independent call_function nodes into buffers; return how many were folded."""
    constant = input_independent(gm)
    computed = [n for n in gm.graph.nodes if n in constant and n.op == "call_function"]
    if not computed:
        return 0
    frontier = [n for n in computed if any(u not in constant for u in n.users)]
    if not frontier:
        return 0
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    values: dict[fx.Node, object] = {}
    with _disable_current_modes(), unset_fake_temporarily(), torch.no_grad():
        for node in gm.graph.nodes:
            if node not in constant:
                continue
            try:
                if node.op == "get_attr":
                    values[node] = _real(getattr(gm, node.target))
                    continue
                source = _metadata_source(node)

                def value_of(arg: fx.Node, source=source):
                    if arg in values:
                        return values[arg]
                    if arg is source:  # only its metadata is read
                        return _stand_in(arg)
                    raise LookupError(f"{arg.name} was not evaluated")

                args = fx.map_arg(node.args, value_of)
                kwargs = fx.map_arg(node.kwargs, value_of)
                value = node.target(*args, **kwargs)
                # a private copy: the graph must not alias a tensor anything else may mutate
                values[node] = value.detach().clone() if isinstance(value, torch.Tensor) else value
            except Exception:  # not evaluable here: the node stays (and is judged normally)
                continue
    folded = 0
    for index, node in enumerate(frontier):
        value = values.get(node)
        if type(value) in (int, float, bool):  # a size read from static metadata: a literal
            _inline_literal(node, value)
            folded += 1
            continue
        if not isinstance(value, torch.Tensor) or _bytes(value) > MAX_FOLDED_BYTES:
            continue
        name = f"{PREFIX}{index}"
        while hasattr(gm, name):
            name += "_"
        gm.register_buffer(name, value)
        with gm.graph.inserting_before(node):
            const = gm.graph.get_attr(name)
        const.meta = dict(node.meta)
        node.replace_all_uses_with(const)
        folded += 1
    if folded:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return folded

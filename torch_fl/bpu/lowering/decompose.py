"""Fused attention and transformer kernels -> the plain ops they compute (matmul, softmax, ...).

Dynamo hands the backend the CPU's fused kernels: `_scaled_dot_product_flash_attention_for_cpu`
(and the other SDPA variants), `_native_multi_head_attention` and the `nn.TransformerEncoderLayer`
fast path `_transformer_encoder_layer_fwd`. None of them exports to ONNX as one op, and the
flash kernel returns a second output (logsumexp) that nothing reads but that made every attention
a partition boundary. Each is replaced by the math it computes, traced with make_fx from the
reference formula below and inlined, so the partitioner sees only ops it supports. Causal masks
come out as shape-only subgraphs (`ones`, `tril`) that `constants.fold_constants` turns into
initializers. `_safe_softmax` (the softmax of SDPA's math path) becomes float-only ops too.

Each fused op has one function registered in `DECOMPOSITIONS` (lowering/registry.py), with a
validator for the forms it can replace (no dropout, no mask, one LSTM direction, ...); the
function says which reference formula stands for the node and `decompose` traces and inlines it.
"""

from __future__ import annotations

import logging
import math
import operator
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import fx

from torch_fl.bpu.lowering.registry import PassRegistry

aten = torch.ops.aten
log = logging.getLogger("torch_fl.bpu")


def safe_softmax(x, dim, dtype=None):
    """softmax along `dim`, with rows that are entirely -inf giving zeros instead of NaN (what
    `_safe_softmax` computes), in float ops only: the BPU takes no boolean row test on runtime
    data. keep = clamp(max - lowest + 1, 0, 1) is exactly 0 for a row whose max is -inf and 1
    for any other row; log(1 - keep) is then -inf (max(x, -inf) leaves x bit-identical) or 0
    (a fully masked row becomes zeros: softmax is uniform there, and is multiplied by 0)."""
    lowest = torch.finfo(x.dtype).min
    keep = torch.clamp(torch.amax(x, dim, keepdim=True) - lowest + 1.0, 0.0, 1.0)
    floor = torch.log(1.0 - keep)
    return torch.softmax(torch.maximum(x, floor), dim, dtype=dtype) * keep


def attention(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """softmax(q k^T * scale + mask) v, the definition scaled_dot_product_attention implements."""
    length, source = q.shape[-2], k.shape[-2]
    if enable_gqa and q.shape[-3] != k.shape[-3]:
        repeat = q.shape[-3] // k.shape[-3]
        k = k.repeat_interleave(repeat, -3)
        v = v.repeat_interleave(repeat, -3)
    factor = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = torch.matmul(q, k.transpose(-2, -1)) * factor
    if is_causal:
        keep = torch.ones(length, source, dtype=torch.bool, device=q.device).tril()
        scores = torch.where(keep, scores, float("-inf"))
    if attn_mask is None:
        return torch.matmul(torch.softmax(scores, -1), v)
    if attn_mask.dtype == torch.bool:
        scores = torch.where(attn_mask, scores, float("-inf"))
    else:
        scores = scores + attn_mask
    # a mask can hide every key from a query: the kernels give that query zeros, not NaN
    return torch.matmul(safe_softmax(scores, -1), v)


def _project_heads(x, weight, bias, heads):
    b, t, _ = x.shape
    y = F.linear(x, weight, bias)
    return y.reshape(b, t, heads, -1).transpose(1, 2)


def self_attention_block(query, key, value, embed_dim, heads, qkv_w, qkv_b, proj_w, proj_b):
    """nn.MultiheadAttention's computation (batch-first, no mask, weights not returned)."""
    e = embed_dim
    q = _project_heads(query, qkv_w[:e], qkv_b[:e], heads)
    k = _project_heads(key, qkv_w[e : 2 * e], qkv_b[e : 2 * e], heads)
    v = _project_heads(value, qkv_w[2 * e :], qkv_b[2 * e :], heads)
    y = attention(q, k, v)
    b, t = query.shape[0], query.shape[1]
    return F.linear(y.transpose(1, 2).reshape(b, t, e), proj_w, proj_b)


def encoder_layer(
    src, embed_dim, heads, qkv_w, qkv_b, proj_w, proj_b, use_gelu, norm_first, eps,
    n1_w, n1_b, n2_w, n2_b, ff1_w, ff1_b, ff2_w, ff2_b,
):  # fmt: skip
    """nn.TransformerEncoderLayer.forward in eval mode (dropout is the identity)."""

    def sa(x):
        return self_attention_block(x, x, x, embed_dim, heads, qkv_w, qkv_b, proj_w, proj_b)

    def ff(x):
        hidden = F.linear(x, ff1_w, ff1_b)
        hidden = F.gelu(hidden) if use_gelu else F.relu(hidden)
        return F.linear(hidden, ff2_w, ff2_b)

    shape = (embed_dim,)
    if norm_first:
        x = src + sa(F.layer_norm(src, shape, n1_w, n1_b, eps))
        return x + ff(F.layer_norm(x, shape, n2_w, n2_b, eps))
    x = F.layer_norm(src + sa(src), shape, n1_w, n1_b, eps)
    return F.layer_norm(x + ff(x), shape, n2_w, n2_b, eps)


def lstm_layer(inp, w_ih, w_hh, b_ih, b_hh, hx, cx, reverse: bool):
    """One LSTM layer and direction over a (T, B, I) sequence, gates in (i, f, g, o) order:
    c' = sigmoid(f) c + sigmoid(i) tanh(g), h' = sigmoid(o) tanh(c'). Returns (y, h_T, c_T)."""
    h, c = hx[0], cx[0]
    projected = F.linear(inp, w_ih, b_ih)
    steps = list(range(inp.shape[0]))
    outputs = [None] * len(steps)
    for t in reversed(steps) if reverse else steps:
        gates = projected[t] + F.linear(h, w_hh, b_hh)
        i, f, g, o = gates.chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outputs[t] = h
    return torch.stack(outputs, 0), h.unsqueeze(0), c.unsqueeze(0)


class Decomposition(NamedTuple):
    """What replaces one fused node: `fn` of its tensor inputs, traced and inlined."""

    fn: Callable
    tensors: list
    """The node's tensor inputs, in `fn`'s argument order."""
    replaced: tuple[int, ...] | None
    """The tuple outputs `fn` stands for (getitem indices); None: the node returns one tensor."""


Decomposer = Callable[[fx.Node], Decomposition | None]
"""A decomposition pass: the node's `Decomposition`, or None when it declines the node."""

DECOMPOSITIONS: PassRegistry[Decomposer] = PassRegistry("decomposition")
"""Every decomposition, by the fused op it handles, named after that op (`decompose` counts
it so: "safe_softmax", "scaled_dot_product_flash_attention_for_cpu", ...)."""


def _call_values(node: fx.Node, names: tuple[str, ...]) -> dict:
    """The node's arguments by schema name (positional ones named by `names`, then kwargs)."""
    values = dict(zip(names, node.args, strict=False))
    values.update(node.kwargs)
    return values


@DECOMPOSITIONS.register(aten._safe_softmax.default)
def _safe_softmax(node: fx.Node) -> Decomposition:
    values = _call_values(node, ("self", "dim", "dtype"))
    dim, dtype = values["dim"], values.get("dtype")

    def softmax(x):
        return safe_softmax(x, dim, dtype)

    return Decomposition(softmax, [values["self"]], None)


_RNN_ARGS = (
    "input", "w0", "w1", "w2", "w3", "hx", "cx", "reverse", "batch_sizes", "mode",
    "hidden_size", "num_layers", "has_biases", "bidirectional", "batch_first", "train",
)  # fmt: skip
_LSTM_MODE = 2  # the oneDNN kind for LSTM


def _is_plain_lstm(node: fx.Node) -> bool:
    # one unpacked, sequence-first, one-direction LSTM layer: what `lstm_layer` computes
    values = _call_values(node, _RNN_ARGS)
    return not (
        values.get("mode") != _LSTM_MODE
        or values.get("batch_sizes")
        or values.get("batch_first")
        or values.get("bidirectional")
        or values.get("num_layers", 1) != 1
    )


@DECOMPOSITIONS.register(aten.mkldnn_rnn_layer.default, validator=_is_plain_lstm)
def _lstm(node: fx.Node) -> Decomposition:
    values = _call_values(node, _RNN_ARGS)
    reverse = bool(values.get("reverse"))
    tensors = [values[n] for n in ("input", "w0", "w1", "w2", "w3", "hx", "cx")]

    def lstm(*ts):
        return lstm_layer(*ts, reverse)

    return Decomposition(lstm, tensors, (0, 1, 2))


_SDPA_ARGS = {
    aten.scaled_dot_product_attention.default: (
        "q", "k", "v", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa",
    ),
    aten._scaled_dot_product_flash_attention_for_cpu.default: (
        "q", "k", "v", "dropout_p", "is_causal", "attn_mask", "scale",
    ),
    aten._scaled_dot_product_flash_attention.default: (
        "q", "k", "v", "dropout_p", "is_causal", "return_debug_mask", "scale",
    ),
    aten._scaled_dot_product_efficient_attention.default: (
        "q", "k", "v", "attn_bias", "compute_log_sumexp", "dropout_p", "is_causal", "scale",
    ),
    aten._scaled_dot_product_attention_math.default: (
        "q", "k", "v", "attn_mask", "dropout_p", "is_causal", "dropout_mask", "scale",
        "enable_gqa",
    ),
}  # fmt: skip


def _sdpa_values(node: fx.Node) -> dict:
    """An SDPA-family node's arguments by name, its mask always under "attn_mask"."""
    values = _call_values(node, _SDPA_ARGS[node.target])
    if "attn_bias" in values:
        values["attn_mask"] = values.pop("attn_bias")
    return values


def _no_dropout(node: fx.Node) -> bool:
    # dropout is random: not an inference graph the BPU can run
    values = _sdpa_values(node)
    return values.get("dropout_p", 0.0) in (0, 0.0) and values.get("dropout_mask") is None


@DECOMPOSITIONS.register(*_SDPA_ARGS, validator=_no_dropout)
def _sdpa(node: fx.Node) -> Decomposition:
    sdpa = _sdpa_values(node)
    tensors = [sdpa.get("q"), sdpa.get("k"), sdpa.get("v")]
    has_mask = isinstance(sdpa.get("attn_mask"), fx.Node)
    if has_mask:
        tensors.append(sdpa["attn_mask"])
    causal, scale = bool(sdpa.get("is_causal")), sdpa.get("scale")
    gqa = bool(sdpa.get("enable_gqa"))

    def fn(*qkv_mask):
        mask = qkv_mask[3] if has_mask else None
        return attention(*qkv_mask[:3], mask, causal, scale, gqa)

    # only the public op returns one tensor; the kernels add logsumexp and friends
    single = node.target is aten.scaled_dot_product_attention.default
    return Decomposition(fn, tensors, None if single else (0,))


_MHA_ARGS = (
    "query", "key", "value", "embed_dim", "num_head", "qkv_weight", "qkv_bias",
    "proj_weight", "proj_bias", "mask", "need_weights", "average_attn_weights", "mask_type",
)  # fmt: skip


def _mha_unmasked(node: fx.Node) -> bool:
    return _call_values(node, _MHA_ARGS).get("mask") is None


@DECOMPOSITIONS.register(aten._native_multi_head_attention.default, validator=_mha_unmasked)
def _multi_head_attention(node: fx.Node) -> Decomposition:
    values = _call_values(node, _MHA_ARGS)
    e, heads = values["embed_dim"], values["num_head"]
    tensors = [values[n] for n in _MHA_ARGS[:3] + _MHA_ARGS[5:9]]

    def mha(query, key, value, qkv_w, qkv_b, proj_w, proj_b):
        return self_attention_block(query, key, value, e, heads, qkv_w, qkv_b, proj_w, proj_b)

    return Decomposition(mha, tensors, (0,))


def _encoder_args(node: fx.Node) -> list:
    # _transformer_encoder_layer_fwd has 20 parameters; the trailing optional ones may be absent
    return list(node.args) + [None] * (20 - len(node.args))


def _encoder_unmasked(node: fx.Node) -> bool:
    return _encoder_args(node)[18] is None and node.kwargs.get("mask") is None


@DECOMPOSITIONS.register(aten._transformer_encoder_layer_fwd.default, validator=_encoder_unmasked)
def _encoder_layer(node: fx.Node) -> Decomposition:
    args = _encoder_args(node)
    e, heads, use_gelu, norm_first, eps = args[1], args[2], args[7], args[8], args[9]
    tensor_slots = [0, 3, 4, 5, 6, 10, 11, 12, 13, 14, 15, 16, 17]
    tensors = [args[i] for i in tensor_slots]

    def layer(src, qkv_w, qkv_b, proj_w, proj_b, *rest):
        return encoder_layer(
            src, e, heads, qkv_w, qkv_b, proj_w, proj_b, use_gelu, norm_first, eps, *rest
        )

    return Decomposition(layer, tensors, None)


def _trace(fn: Callable, tensors: list[fx.Node]) -> fx.GraphModule | None:
    from torch.fx.experimental.proxy_tensor import make_fx

    vals = [t.meta.get("val") for t in tensors]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return None
    sub = make_fx(fn, tracing_mode="real")(*vals)
    # make_fx keeps a getitem per output of tuple ops (layer norm's mean/rstd): unused ones must
    # go, or they would keep those ops tuple-valued
    sub.graph.eliminate_dead_code()
    return sub


def _inline(gm: fx.GraphModule, node: fx.Node, sub: fx.GraphModule, tensors: list[fx.Node]):
    graph = gm.graph
    env: dict[fx.Node, object] = {}
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    for ph, arg in zip(placeholders, tensors, strict=True):
        env[ph] = arg
    result = None
    with graph.inserting_before(node):
        for n in sub.graph.nodes:
            if n.op == "placeholder":
                continue
            if n.op == "output":
                result = fx.map_arg(n.args[0], lambda a: env[a])
                continue
            if n.op == "get_attr":
                value = getattr(sub, n.target)
                name = f"_bpu_decomp_const_{len(list(gm.buffers()))}"
                while hasattr(gm, name):
                    name += "_"
                gm.register_buffer(name, value)
                new = graph.get_attr(name)
                new.meta = dict(n.meta)
                env[n] = new
                continue
            new = graph.node_copy(n, lambda a: env[a])
            new.meta = dict(n.meta)
            env[n] = new
    return result


def _decompose_node(gm: fx.GraphModule, node: fx.Node) -> str | None:
    """Replace `node` by its registered decomposition; its name, or None if it stays fused."""
    entry = DECOMPOSITIONS.find(node)
    found = entry.fn(node) if entry is not None else None
    if found is None:
        return None
    fn, tensors, replaced = found
    if replaced is not None:
        users = list(node.users)
        if any(u.target is not operator.getitem or u.args[1] not in replaced for u in users):
            return None  # an extra output (logsumexp, attention weights) is really used
    try:
        sub = _trace(fn, tensors)
    except Exception as exc:  # leave the fused op (and its reason) to the partitioner
        log.debug("decomposing %s failed: %s", node.target, exc)
        sub = None
    if sub is None:
        return None
    result = _inline(gm, node, sub, tensors)
    if replaced is not None:
        pieces = result if isinstance(result, (tuple, list)) else (result,)
        for user in list(node.users):
            user.replace_all_uses_with(pieces[user.args[1]])
            gm.graph.erase_node(user)
    else:
        node.replace_all_uses_with(result)
    gm.graph.erase_node(node)
    return entry.name


def decompose(gm: fx.GraphModule) -> dict[str, int]:
    """Replace fused attention/transformer nodes in place; return {op name: count}."""
    fired: dict[str, int] = {}
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        name = _decompose_node(gm, node)
        if name is not None:
            fired[name] = fired.get(name, 0) + 1
    if fired:
        gm.graph.lint()
        gm.recompile()
    return fired

"""Fused attention and transformer kernels -> the plain ops they compute (matmul, softmax, ...).

Dynamo hands the backend the CPU's fused kernels: `_scaled_dot_product_flash_attention_for_cpu`
(and the other SDPA variants), `_native_multi_head_attention` and the `nn.TransformerEncoderLayer`
fast path `_transformer_encoder_layer_fwd`. None of them exports to ONNX as one op, and the
flash kernel returns a second output (logsumexp) that nothing reads but that made every attention
a partition boundary. Each is replaced by the math it computes, traced with make_fx from the
reference formula below and inlined, so the partitioner sees only ops it supports. Causal masks
come out as shape-only subgraphs (`ones`, `tril`) that `constants.fold_constants` turns into
initializers. `_safe_softmax` (the softmax of SDPA's math path) becomes float-only ops too.
"""

from __future__ import annotations

import logging
import math
import operator
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import fx

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


def _sdpa_args(node: fx.Node) -> dict | None:
    """Keyword form of an SDPA-family node's inputs, or None if it cannot be decomposed."""
    target = node.target
    names = {
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
    }.get(target)  # fmt: skip
    if names is None:
        return None
    values = dict(zip(names, node.args, strict=False))
    values.update(node.kwargs)
    if "attn_bias" in values:
        values["attn_mask"] = values.pop("attn_bias")
    if values.get("dropout_p", 0.0) not in (0, 0.0) or values.get("dropout_mask") is not None:
        return None  # dropout is random: not an inference graph the BPU can run
    return {
        key: values.get(key)
        for key in ("q", "k", "v", "attn_mask", "is_causal", "scale", "enable_gqa")
    }


def _decomposition(node: fx.Node) -> tuple[Callable, list, tuple[int, ...] | None] | None:
    """(function of the tensor inputs, those inputs, the tuple outputs it replaces (None: the
    node returns one tensor))."""
    target = node.target
    if target is aten._safe_softmax.default:
        values = dict(zip(("self", "dim", "dtype"), node.args, strict=False))
        values.update(node.kwargs)
        dim, dtype = values["dim"], values.get("dtype")

        def softmax(x):
            return safe_softmax(x, dim, dtype)

        return softmax, [values["self"]], None
    if target is aten.mkldnn_rnn_layer.default:
        names = (
            "input", "w0", "w1", "w2", "w3", "hx", "cx", "reverse", "batch_sizes", "mode",
            "hidden_size", "num_layers", "has_biases", "bidirectional", "batch_first", "train",
        )  # fmt: skip
        values = dict(zip(names, node.args, strict=False))
        values.update(node.kwargs)
        lstm_mode = 2  # the oneDNN kind for LSTM
        if (
            values.get("mode") != lstm_mode
            or values.get("batch_sizes")
            or values.get("batch_first")
            or values.get("bidirectional")
            or values.get("num_layers", 1) != 1
        ):
            return None
        reverse = bool(values.get("reverse"))
        tensors = [values[n] for n in ("input", "w0", "w1", "w2", "w3", "hx", "cx")]

        def lstm(*ts):
            return lstm_layer(*ts, reverse)

        return lstm, tensors, (0, 1, 2)
    sdpa = _sdpa_args(node)
    if sdpa is not None:
        tensors = [sdpa["q"], sdpa["k"], sdpa["v"]]
        has_mask = isinstance(sdpa["attn_mask"], fx.Node)
        if has_mask:
            tensors.append(sdpa["attn_mask"])
        causal, scale, gqa = bool(sdpa["is_causal"]), sdpa["scale"], bool(sdpa["enable_gqa"])

        def fn(*qkv_mask):
            mask = qkv_mask[3] if has_mask else None
            return attention(*qkv_mask[:3], mask, causal, scale, gqa)

        single = target is aten.scaled_dot_product_attention.default
        return fn, tensors, None if single else (0,)
    if target is aten._native_multi_head_attention.default:
        names = (
            "query", "key", "value", "embed_dim", "num_head", "qkv_weight", "qkv_bias",
            "proj_weight", "proj_bias", "mask", "need_weights", "average_attn_weights",
            "mask_type",
        )  # fmt: skip
        values = dict(zip(names, node.args, strict=False))
        values.update(node.kwargs)
        if values.get("mask") is not None:
            return None
        e, heads = values["embed_dim"], values["num_head"]
        tensors = [values[n] for n in names[:3] + names[5:9]]

        def mha(query, key, value, qkv_w, qkv_b, proj_w, proj_b):
            return self_attention_block(query, key, value, e, heads, qkv_w, qkv_b, proj_w, proj_b)

        return mha, tensors, (0,)
    if target is aten._transformer_encoder_layer_fwd.default:
        args = list(node.args) + [None] * (20 - len(node.args))
        if args[18] is not None or node.kwargs.get("mask") is not None:
            return None
        e, heads, use_gelu, norm_first, eps = args[1], args[2], args[7], args[8], args[9]
        tensor_slots = [0, 3, 4, 5, 6, 10, 11, 12, 13, 14, 15, 16, 17]
        tensors = [args[i] for i in tensor_slots]

        def layer(src, qkv_w, qkv_b, proj_w, proj_b, *rest):
            return encoder_layer(
                src, e, heads, qkv_w, qkv_b, proj_w, proj_b, use_gelu, norm_first, eps, *rest
            )

        return layer, tensors, None
    return None


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


def decompose(gm: fx.GraphModule) -> dict[str, int]:
    """Replace fused attention/transformer nodes in place; return {op name: count}."""
    fired: dict[str, int] = {}
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        found = _decomposition(node)
        if found is None:
            continue
        fn, tensors, replaced = found
        if replaced is not None:
            users = list(node.users)
            if any(u.target is not operator.getitem or u.args[1] not in replaced for u in users):
                continue  # an extra output (logsumexp, attention weights) is really used
        try:
            sub = _trace(fn, tensors)
        except Exception as exc:  # leave the fused op (and its reason) to the partitioner
            log.debug("decomposing %s failed: %s", node.target, exc)
            sub = None
        if sub is None:
            continue
        result = _inline(gm, node, sub, tensors)
        if replaced is not None:
            pieces = result if isinstance(result, (tuple, list)) else (result,)
            for user in list(node.users):
                user.replace_all_uses_with(pieces[user.args[1]])
                gm.graph.erase_node(user)
        else:
            node.replace_all_uses_with(result)
        gm.graph.erase_node(node)
        name = str(node.target.overloadpacket.__name__).lstrip("_")
        fired[name] = fired.get(name, 0) + 1
    if fired:
        gm.graph.lint()
        gm.recompile()
    return fired

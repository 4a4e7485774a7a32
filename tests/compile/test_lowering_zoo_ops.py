"""Attention, transformer fast paths, resampling, shape-only constants: what the zoo relies on."""

import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.compile.bpu_helpers import compile_bpu, cosine
from torch_fl.bpu import report


def _run(model, *inputs, **options):
    with report.collect() as reps, torch.no_grad():
        out = compile_bpu(model, **options)(*inputs)
    return out, report.Report(list(reps)), reps


class Attention(nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.proj = nn.Linear(16, 16)

    def forward(self, q, k, v, mask):
        q = self.proj(q)
        if self.mode == "causal":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif self.mode == "bool":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.bool())
        elif self.mode == "float":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
        else:
            y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y)


@pytest.mark.parametrize("mode", ["plain", "causal", "bool", "float"])
def test_sdpa_variants_inside_one_partition(mode):
    torch.manual_seed(0)
    model = Attention(mode).eval()
    q, k, v = (torch.randn(2, 2, 8, 16) for _ in range(3))
    mask = torch.randn(8, 8)
    mask[:, 0] = 1.0  # every query keeps one key (a fully masked row is NaN by definition)
    if mode == "bool":
        mask = mask > 0  # a boolean mask input: True = attend
    out, rep, reps = _run(model, q, k, v, mask, executor="eager")
    torch.testing.assert_close(out, model(q, k, v, mask), rtol=1e-5, atol=1e-5)
    assert rep.coverage_pct == 100.0 and len(rep.partitions) == 1, rep.table()
    decomposed = {k for g in reps for k in g.rewrites}
    assert "scaled_dot_product_flash_attention_for_cpu" in decomposed
    if mode == "causal":
        assert reps[0].rewrites["constants_folded"] >= 1  # the causal mask is an initializer
    torch._dynamo.reset()
    out, _, _ = _run(model, q, k, v, mask, executor="sim")
    assert cosine(out, model(q, k, v, mask)) > 0.99


@pytest.mark.parametrize("grad", [False, True])
def test_multihead_attention_and_transformer_layers(grad):
    torch.manual_seed(0)
    encoder = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, norm_first=True)
    decoder = nn.TransformerDecoderLayer(32, 4, 64, batch_first=True)
    mha = nn.MultiheadAttention(32, 4, batch_first=True)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder, self.decoder, self.mha = encoder, decoder, mha

        def forward(self, x, memory):
            y = self.encoder(x)
            y = self.decoder(y, memory)
            return y + self.mha(y, memory, memory, need_weights=False)[0]

    net = Net().eval()
    x, memory = torch.randn(2, 6, 32), torch.randn(2, 5, 32)
    with torch.no_grad():
        ref = net(x, memory)
    with torch.set_grad_enabled(grad), report.collect() as reps:
        out = compile_bpu(net, executor="eager")(x, memory)
    rep = report.Report(list(reps))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert rep.coverage_pct == 100.0 and len(rep.partitions) == 1, rep.table()


def test_interpolate_is_one_resize_and_exact():
    class UpNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x):
            y = F.interpolate(self.conv(x), scale_factor=2, mode="bilinear")
            return F.interpolate(y, size=(20, 24), mode="nearest") * 2

    torch.manual_seed(0)
    model = UpNet().eval()
    x = torch.randn(1, 3, 8, 10)
    out, rep, reps = _run(model, x, executor="eager")
    assert torch.equal(out, model(x))  # the real upsample kernels, not index arithmetic
    assert rep.coverage_pct == 100.0 and len(rep.partitions) == 1, rep.table()
    assert reps[0].rewrites["resize"] == 2
    torch._dynamo.reset()
    out, _, reps = _run(model, x, executor="sim")
    m = onnx.load_from_string(reps[0].runtimes[0].last_build.onnx_bytes)
    ops = [n.op_type for n in m.graph.node]
    assert ops.count("Resize") == 2 and "Gather" not in ops
    assert cosine(out, model(x)) > 0.99  # default activation scale, uncalibrated


def test_swin_window_attention_folds_mask_and_tracks_bias_table_changes():
    from tests.support.zoo import WindowAttention

    torch.manual_seed(0)
    block = WindowAttention(16, 2, 4, 2).eval()
    x = torch.randn(1, 8, 8, 16)
    compiled = compile_bpu(block, executor="sim")
    with report.collect() as reps, torch.no_grad():
        first = compiled(x)
    rep = report.Report(list(reps))
    assert rep.coverage_pct == 100.0 and len(rep.partitions) == 1, rep.table()
    assert reps[0].rewrites["constants_folded"] >= 1  # the shifted-window mask
    assert cosine(first, block(x)) > 0.99
    with torch.no_grad():
        block.bias_table.mul_(0).add_(torch.randn_like(block.bias_table) * 5)
        second = compiled(x)
        expected = block(x)
    # the gathered bias came from a weight: a changed table must change the answer
    assert cosine(second, expected) > 0.99 and cosine(second, first) < 0.99


def test_more_public_architecture_ops_offload_and_export():
    """GroupNorm, PReLU, erf/log/sin/cos, softplus/mish, pixel_shuffle, stack, flip, normalize."""

    class Ops(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 8, 1)
            self.gn = nn.GroupNorm(2, 8)
            self.prelu = nn.PReLU()

        def forward(self, x):
            y = self.gn(self.conv(x))
            y = torch.erf(y) + torch.log(y.abs() + 1) + torch.sin(y) * torch.cos(y)
            y = F.softplus(y) + F.mish(y) + self.prelu(y)
            y = F.pixel_shuffle(y, 2)
            y = torch.stack([y, y.flip(-1)], 1).sum(1)
            return F.normalize(y, dim=1)

    torch.manual_seed(0)
    model = Ops().eval()
    x = torch.randn(1, 4, 6, 6)
    out, rep, reps = _run(model, x, executor="eager")
    torch.testing.assert_close(out, model(x))
    assert rep.coverage_pct == 100.0 and len(rep.partitions) == 1, rep.table()
    assert {"group_norm", "prelu"} <= set(reps[0].rewrites)
    torch._dynamo.reset()
    out, _, reps = _run(model, x, executor="sim", quantize=False)
    assert reps[0].runtimes[0].kind == "sim"  # exported
    torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)


def test_causal_mask_buffer_compared_in_the_partition():
    """nanoGPT-style attention: masked_fill(tril_buffer[..., :T, :T] == 0, -inf) on a buffer."""

    class CausalSelfAttention(nn.Module):
        def __init__(self, dim=32, heads=4, block=16):
            super().__init__()
            self.heads = heads
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)
            self.register_buffer("bias", torch.tril(torch.ones(block, block))[None, None])

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = (
                z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                for z in self.qkv(x).split(c, dim=2)
            )
            att = (q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5
            att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
            y = torch.softmax(att, dim=-1) @ v
            return self.proj(y.transpose(1, 2).reshape(b, t, c))

    torch.manual_seed(0)
    model = CausalSelfAttention().eval()
    x = torch.randn(2, 12, 32)
    out, rep, _ = _run(model, x, executor="eager")
    torch.testing.assert_close(out, model(x))
    assert rep.coverage_pct == 100.0 and len(rep.partitions) == 1, rep.table()
    torch._dynamo.reset()
    out, _, reps = _run(model, x, executor="sim")
    assert reps[0].runtimes[0].kind == "sim"
    assert cosine(out, model(x)) > 0.99


def test_embedding_and_padding_mask_cast_offload():
    """BERT-style: token ids through nn.Embedding, an int64 padding mask cast to an additive
    float mask; both inside the partition (Gather, Cast)."""

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(100, 16)
            self.out = nn.Linear(16, 16)

        def forward(self, ids, mask):
            x = self.embed(ids)
            additive = (1.0 - mask[:, None, :].float()) * -10000.0
            att = torch.softmax(x @ x.transpose(-1, -2) + additive, -1)
            return self.out(att @ x)

    torch.manual_seed(0)
    model = Encoder().eval()
    ids = torch.randint(0, 100, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    out, rep, reps = _run(model, ids, mask, executor="eager")
    torch.testing.assert_close(out, model(ids, mask))
    assert rep.coverage_pct == 100.0 and len(rep.partitions) == 1, rep.table()
    assert reps[0].rewrites["cast"] == 1
    torch._dynamo.reset()
    out, _, reps = _run(model, ids, mask, executor="sim", quantize=False)
    assert reps[0].runtimes[0].kind == "sim"
    torch.testing.assert_close(out, model(ids, mask), rtol=1e-5, atol=1e-5)


def test_lstm_traced_with_allow_rnn_is_decomposed_and_offloaded():
    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(16, 24, num_layers=2, batch_first=True, bidirectional=True)
            self.head = nn.Linear(48, 5)

        def forward(self, x):
            y, (h, c) = self.lstm(x)
            return self.head(y[:, -1]) + h.sum(0).mean() + c.sum(0).mean()

    torch.manual_seed(0)
    model = Tagger().eval()
    x = torch.randn(2, 6, 16)
    with torch._dynamo.config.patch(allow_rnn=True):
        out, rep, reps = _run(model, x, executor="eager")
        assert report.graph_breaks(model, x) == []
    torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
    assert rep.coverage_pct == 100.0 and len(rep.partitions) == 1, rep.table()
    assert reps[0].rewrites["mkldnn_rnn_layer"] == 4  # 2 layers x 2 directions

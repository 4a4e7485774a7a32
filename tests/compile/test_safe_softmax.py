"""`aten._safe_softmax` (SDPA's math path) runs in a BPU partition: softmax, with rows that are
entirely -inf (every key masked) giving zeros instead of NaN."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from tests.compile.bpu_helpers import compile_bpu, cosine
from torch_fl.bpu import report


class SafeSoftmax(nn.Module):
    def forward(self, x):
        return torch.ops.aten._safe_softmax(x * 2.0, -1)


class MaskedAttention(nn.Module):
    """Self-attention through SDPA's math backend, whose softmax is `_safe_softmax`."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x, keep):
        q, k, v = self.qkv(x).unsqueeze(1).chunk(3, -1)
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


def _run(model, *inputs, executor):
    torch._dynamo.reset()
    with report.collect() as reps, torch.no_grad():
        out = compile_bpu(model, executor=executor)(*inputs)
    return out, report.Report(list(reps))


def _rows() -> torch.Tensor:
    x = torch.randn(2, 6, 8)
    lowest = torch.finfo(torch.float32).min
    x[0, 0] = float("-inf")  # every key masked: zeros, not NaN
    x[0, 1, 3:] = float("-inf")  # partly masked: an ordinary softmax over the rest
    x[1, 2] = -1e30  # hugely negative but finite: uniform, not zeroed
    x[1, 3] = lowest / 2.0  # doubled by the model to the lowest finite float: still uniform
    x[1, 4, :2] = float("-inf")
    x[1, 4, 2:] = lowest / 2.0
    return x


def test_safe_softmax_offloads_and_is_exact():
    model = SafeSoftmax()
    x = _rows()
    ref = model(x)
    assert torch.equal(ref[0, 0], torch.zeros(8)) and not ref.isnan().any()
    out, rep = _run(model, x, executor="eager")
    assert torch.equal(out, ref)
    assert rep.cpu_nodes == [] and len(rep.partitions) == 1, rep.table()
    assert rep.graphs[0].rewrites["safe_softmax"] == 1


def test_sdpa_math_path_with_fully_masked_rows_offloads():
    torch.manual_seed(0)
    model = MaskedAttention().eval()
    x = torch.randn(2, 5, 16)
    keep = torch.rand(5, 5) > 0.4
    keep[:, 0] = True
    keep[3] = False  # query 3 may attend to nothing: its output is zero
    with torch.no_grad():
        ref = model(x, keep)
    assert torch.equal(ref[:, :, 3], torch.zeros(2, 1, 16))

    out, rep = _run(model, x, keep, executor="eager")
    assert torch.equal(out, ref)
    assert rep.coverage_pct == 100.0 and len(rep.partitions) == 1, rep.table()
    assert not any("safe_softmax" in n["target"] for n in rep.cpu_nodes), rep.table()

    out, rep = _run(model, x, keep, executor="sim")
    assert len(rep.partitions) == 1 and rep.partitions[0].executor == "sim", rep.table()
    assert cosine(out, ref) > 0.99  # int8, default activation scale, uncalibrated
    assert torch.equal(out[:, :, 3], torch.zeros(2, 1, 16))


class FusedMaskedAttention(MaskedAttention):
    """The default SDPA kernel (the fused CPU one), which the lowering decomposes."""

    def forward(self, x, keep):
        q, k, v = self.qkv(x).unsqueeze(1).chunk(3, -1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


def test_decomposed_fused_attention_gives_fully_masked_queries_zeros():
    torch.manual_seed(0)
    model = FusedMaskedAttention().eval()
    x = torch.randn(2, 5, 16)
    keep = torch.ones(5, 5, dtype=torch.bool)
    keep[1] = False
    with torch.no_grad():
        ref = model(x, keep)
    assert torch.equal(ref[:, :, 1], torch.zeros(2, 1, 16))
    out, rep = _run(model, x, keep, executor="eager")
    assert not out.isnan().any()
    # the fused kernel is replaced by the float math it computes: close, not bit-identical
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert rep.coverage_pct == 100.0 and len(rep.partitions) == 1, rep.table()

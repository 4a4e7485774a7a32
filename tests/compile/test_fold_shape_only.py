"""Values computed from an input's metadata only (shape, dtype, device) fold into constants.

The model below follows torchvision's Swin shifted-window attention: its attention mask starts
as `x.new_zeros((padded_h, padded_w))` of the padded activation, gets region labels written by
slice assignment, and becomes a -100/0 mask through a difference and two `masked_fill`s. None of
it reads x's data, so it must become one constant and the block one BPU partition.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.experimental.proxy_tensor import make_fx

from tests.compile.bpu_helpers import compile_bpu
from torch_fl.bpu import report
from torch_fl.bpu.lowering.constants import fold_constants, input_independent

aten = torch.ops.aten

# what the mask is built from in the traced graph; none of it may be left on the CPU
MASK_OPS = (
    "new_zeros",
    "lift_fresh_copy",
    "fill",
    "slice_scatter",
    "ne.Scalar",
    "eq.Scalar",
    "masked_fill",
)


def region_mask(x: torch.Tensor, height: int, width: int, window: int, shift: int):
    """(windows, N, N) additive mask: -100 between tokens of one shifted window that came from
    different regions of the rolled image, 0 elsewhere. Built the way torchvision builds it:
    `new_zeros` of the activation `x` (its dtype and device), then slice assignments."""
    labels = x.new_zeros((height, width))
    bands = ((0, -window), (-window, -shift), (-shift, None))
    region = 0
    for top, bottom in bands:
        for left, right in bands:
            labels[top:bottom, left:right] = region
            region += 1
    labels = labels.view(height // window, window, width // window, window)
    labels = labels.permute(0, 2, 1, 3).reshape(-1, window * window)
    diff = labels.unsqueeze(1) - labels.unsqueeze(2)
    return diff.masked_fill(diff != 0, -100.0).masked_fill(diff == 0, 0.0)


class ShiftedWindowAttention(nn.Module):
    def __init__(self, dim: int, heads: int, window: int, shift: int) -> None:
        super().__init__()
        self.dim, self.heads, self.window, self.shift = dim, heads, window, shift
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.table = nn.Parameter(torch.randn((2 * window - 1) ** 2, heads) * 0.1)
        rows, cols = torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")
        flat = torch.stack((rows.flatten(), cols.flatten()))  # 2, N
        offset = (flat[:, :, None] - flat[:, None, :]) + window - 1  # 2, N, N
        self.register_buffer("table_index", (offset[0] * (2 * window - 1) + offset[1]).flatten())

    def forward(self, x):  # B, H, W, C
        b, h, w, c = x.shape
        win, tokens = self.window, self.window * self.window
        x = F.pad(x, (0, 0, 0, (win - w % win) % win, 0, (win - h % win) % win))
        _, ph, pw, _ = x.shape
        shift = self.shift if win < ph and win < pw else 0
        if shift:
            x = torch.roll(x, (-shift, -shift), (1, 2))
        windows = (ph // win) * (pw // win)
        x = x.view(b, ph // win, win, pw // win, win, c).permute(0, 1, 3, 2, 4, 5)
        x = x.reshape(b * windows, tokens, c)
        qkv = self.qkv(x).reshape(x.size(0), tokens, 3, self.heads, c // self.heads)
        qkv = qkv.permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0] * (c // self.heads) ** -0.5, qkv[1], qkv[2]
        scores = q.matmul(k.transpose(-2, -1))
        bias = self.table[self.table_index].view(tokens, tokens, -1).permute(2, 0, 1)
        scores = scores + bias.contiguous().unsqueeze(0)
        if shift:
            mask = region_mask(x, ph, pw, win, shift)
            scores = scores.view(b, windows, self.heads, tokens, tokens)
            scores = (scores + mask.unsqueeze(1).unsqueeze(0)).view(-1, self.heads, tokens, tokens)
        y = F.softmax(scores, dim=-1).matmul(v)
        y = self.proj(y.transpose(1, 2).reshape(y.size(0), tokens, c))
        y = y.view(b, ph // win, pw // win, win, win, c).permute(0, 1, 3, 2, 4, 5)
        y = y.reshape(b, ph, pw, c)
        if shift:
            y = torch.roll(y, (shift, shift), (1, 2))
        return y[:, :h, :w, :].contiguous()


class SwinStage(nn.Module):
    """A plain block, then a shifted one (pre-norm attention and MLP, residuals)."""

    def __init__(self, dim: int = 16, heads: int = 2, window: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            ShiftedWindowAttention(dim, heads, window, shift) for shift in (0, window // 2)
        )
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(4))
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
            for _ in range(2)
        )

    def forward(self, x):
        for i, (attn, mlp) in enumerate(zip(self.blocks, self.mlps, strict=True)):
            x = x + attn(self.norms[2 * i](x))
            x = x + mlp(self.norms[2 * i + 1](x))
        return x


def _compile_and_run(model, x, executor="eager"):
    with report.collect() as reps, torch.no_grad():
        out = compile_bpu(model, executor=executor)(x)
    return out, report.Report(list(reps))


def _mask_ops_on_cpu(rep: report.Report) -> list[str]:
    return [n["target"] for n in rep.cpu_nodes if any(op in n["target"] for op in MASK_OPS)]


def test_swin_shifted_window_mask_from_new_zeros_folds_into_one_partition():
    torch.manual_seed(0)
    model = SwinStage().eval()
    x = torch.randn(2, 10, 10, 16)  # padded to 12x12: nine 4x4 windows per image
    with torch.no_grad():
        ref = model(x)
    out, rep = _compile_and_run(model, x)
    assert torch.equal(out, ref)
    assert _mask_ops_on_cpu(rep) == [], rep.table()
    assert rep.coverage_pct == 100.0 and len(rep.partitions) == 1, rep.table()
    assert rep.graphs[0].rewrites["constants_folded"] >= 1


def test_folded_mask_follows_the_input_shape():
    """A folded mask belongs to one static shape: another input size recompiles (Dynamo guards
    the shape) and gets its own mask, including sizes where the shift is switched off."""
    torch.manual_seed(0)
    model = SwinStage().eval()
    compiled = compile_bpu(model, executor="eager")
    for size in (10, 8, 13, 4):
        x = torch.randn(1, size, size, 16)
        with report.collect() as reps, torch.no_grad():
            out = compiled(x)
            ref = model(x)
        rep = report.Report(list(reps))
        assert torch.equal(out, ref), size
        assert rep.coverage_pct == 100.0 and len(rep.partitions) == 1, (size, rep.table())


def test_swin_mask_runs_inside_the_partition_under_sim():
    torch.manual_seed(0)
    model = SwinStage().eval()
    x = torch.randn(1, 8, 8, 16)
    out, rep = _compile_and_run(model, x, executor="sim")
    assert len(rep.partitions) == 1 and rep.partitions[0].executor == "sim", rep.table()
    with torch.no_grad():
        ref = model(x)
    cos = F.cosine_similarity(out.flatten(), ref.flatten(), dim=0).item()
    assert cos > 0.99  # default activation scale, uncalibrated


class LikeOps(nn.Module):
    """Each metadata-only constructor feeds an op the BPU does not take (cumsum, int64)."""

    def forward(self, x):
        ramp = torch.ones_like(x).cumsum(-1)
        steps = x.new_full((x.shape[-1],), 2.0).cumsum(0)
        count = torch.zeros_like(x, dtype=torch.int64).add(x.size(-1)).float()
        return x * ramp + steps + count + torch.full_like(x, 0.5) + x.new_ones(x.shape[1:])


def test_like_and_new_constructors_fold_with_their_other_arguments():
    model = LikeOps()
    x = torch.randn(2, 3, 5)
    out, rep = _compile_and_run(model, x)
    assert torch.equal(out, model(x))
    assert rep.cpu_nodes == [], rep.table()
    assert rep.coverage_pct == 100.0 and len(rep.partitions) == 1, rep.table()


def _constant_targets(gm) -> set:
    return {n.target for n in input_independent(gm) if n.op == "call_function"}


def test_input_independent_reads_metadata_but_not_data_or_uninitialised_memory():
    def fn(x):
        zeros = x.new_zeros((x.shape[0], 4)) + 1
        garbage = x.new_empty((3,)) * 0  # uninitialised: any value, never a constant
        data = torch.zeros_like(x) + x  # reads x's data through the add
        return zeros, garbage, data

    gm = make_fx(fn, tracing_mode="fake")(torch.randn(2, 3))
    constant = _constant_targets(gm)
    assert aten.new_zeros.default in constant and aten.zeros_like.default in constant
    assert aten.new_empty.default not in constant
    adds = [n for n in gm.graph.nodes if n.target is aten.add.Tensor]
    assert [n in input_independent(gm) for n in adds] == [True, False]


def test_symbolic_shapes_are_not_folded():
    def fn(x):
        return x.new_zeros((x.shape[0], x.shape[1])) + torch.ones_like(x)

    gm = make_fx(fn, tracing_mode="symbolic")(torch.randn(2, 3))
    assert _constant_targets(gm) == set(), gm.code


def test_static_size_reads_become_literals():
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(2, 3)
    width = graph.call_function(aten.sym_size.int, (x, 1))
    graph.output(graph.call_function(aten.view.default, (x, [-1, width])))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    assert fold_constants(gm) == 1
    assert aten.sym_size.int not in {n.target for n in gm.graph.nodes}
    (view,) = [n for n in gm.graph.nodes if n.target is aten.view.default]
    assert view.args[1] == [-1, 3]
    x = torch.randn(2, 3)
    assert torch.equal(gm(x), x)

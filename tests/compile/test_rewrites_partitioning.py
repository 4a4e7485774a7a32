import operator

import torch
import torch.nn.functional as F
from torch import nn

from tests.compile.bpu_helpers import compile_bpu, cosine
from torch_fl.bpu import report


class BnPool(nn.Module):
    def __init__(self, return_indices: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.MaxPool2d(2, return_indices=return_indices)
        self.fc = nn.Linear(4 * 3 * 3, 5)
        self.return_indices = return_indices

    def forward(self, x):
        y = self.pool(torch.relu(self.bn(self.conv(x))))
        if self.return_indices:
            y, idx = y
            y = y + idx.float() * 0  # really uses the indices
        return torch.softmax(self.fc(y.flatten(1)), -1)


def _explain(model, *inputs, **options):
    with report.collect() as reps, torch.no_grad():
        out = compile_bpu(model, **options)(*inputs)
    return out, reps


def test_tuple_ops_rewritten_and_one_partition():
    model = BnPool().eval()
    x = torch.randn(1, 3, 8, 8)
    out, reps = _explain(model, x, executor="eager")
    assert torch.equal(out, model(x))
    g = reps[0]
    assert g.rewrites["batch_norm"] == 1 and g.rewrites["max_pool2d"] == 1
    assert g.rewrites["softmax"] == 1 and g.rewrites["permute"] == 1
    assert len(g.partitions) == 1 and not [n for n in g.cpu_nodes if "getitem" not in n["target"]]
    assert g.partitions[0].compute_nodes == g.compute_total


def test_used_indices_keep_tuple_op_and_getitem_does_not_poison():
    model = BnPool(return_indices=True).eval()
    x = torch.randn(1, 3, 8, 8)
    out, reps = _explain(model, x, executor="eager")
    assert torch.allclose(out, model(x))
    g = reps[0]
    assert "max_pool2d" not in g.rewrites  # indices are used: kept as the tuple op
    reasons = {n["target"]: n["reason"] for n in g.cpu_nodes}
    assert reasons["aten.max_pool2d_with_indices.default"].startswith("tuple boundary")
    assert any(r.startswith("tuple boundary: reads an output") for r in reasons.values())
    # partitions on both sides, and none of them swallowed a getitem of the CPU tuple op
    assert len(g.partitions) >= 2
    for rt in g.runtimes:
        assert not [n for n in rt.spec.gm.graph.nodes if n.target is operator.getitem]


def test_unsupported_op_dtype_symbolic_and_min_size_reasons():
    class Mixed(nn.Module):
        def forward(self, x, idx):
            y = torch.cumsum(x * 2, 1)  # unsupported op
            return y + 1, idx * 3  # integer elementwise: dtype

    with report.collect() as reps, torch.no_grad():
        compile_bpu(Mixed(), executor="eager", min_partition_ops=2)(
            torch.randn(2, 4), torch.arange(4)
        )
    reasons = " | ".join(n["reason"] for n in reps[0].cpu_nodes)
    assert "unsupported op: aten.cumsum" in reasons
    assert "dtype: output is torch.int64" in reasons
    assert "below minimum size" in reasons

    # dynamic=True: the BPU needs static shapes, so each input shape compiles statically
    torch._dynamo.reset()
    with report.collect() as reps, torch.no_grad():
        fn = torch.compile(nn.ReLU(), backend="bpu", dynamic=True, options={"executor": "eager"})
        fn(torch.randn(3, 4))
        fn(torch.randn(5, 4))
    assert [g.partitions[0].inputs for g in reps] == [[[3, 4]], [[5, 4]]]
    assert not any("symbolic" in n["reason"] for g in reps for n in g.cpu_nodes)


def test_split_becomes_slices_transformer_fully_covered():
    from tests.support.models import TransformerBlock, seeded

    model = seeded(TransformerBlock())
    x = torch.randn(1, 8, 32)
    out, reps = _explain(model, x, executor="eager")
    assert torch.allclose(out, model(x), atol=1e-6)
    rep = report.Report(reps)
    assert rep.coverage_pct >= 95.0 and reps[0].rewrites["split"] == 1


def test_data_movement_rewrites_export_and_unexportable_index_rejected_up_front():
    class Moves(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 1)

        def forward(self, x, idx):
            y = self.conv(x)
            z = y.clone()
            z[:, 1:3] = y[:, 1:3] * 2  # functionalized: slice_scatter + copy
            z = torch.roll(F.pad(z, (1, 1, 1, 1)), (1, -2), (2, 3))[:, :, 1:9, 1:9]
            p = z.contiguous().as_strided((1, 8, 8, 4), (256, 8, 1, 64))  # a permute as strides
            return self.conv2(p.permute(0, 3, 1, 2)) + z[:, :, idx, idx].sum()

    model = Moves().eval()
    model.conv2 = nn.Conv2d(4, 4, 1)
    x, idx = torch.randn(1, 3, 8, 8), torch.tensor([0, 2])
    out, reps = _explain(model, x, idx, executor="eager")
    torch.testing.assert_close(out, model(x, idx))
    g = reps[0]
    assert {"slice_scatter", "copy", "as_strided_permute"} <= set(g.rewrites)
    reasons = {n["target"]: n["reason"] for n in g.cpu_nodes}
    assert set(reasons) == {"aten.index.Tensor"}  # two index tensors: rejected with a reason
    assert reasons["aten.index.Tensor"].startswith("export:")
    torch._dynamo.reset()
    out, reps = _explain(model, x, idx, executor="sim", quantize=False)
    assert all(rt.kind == "sim" for rt in reps[0].runtimes)  # every accepted partition exported
    torch.testing.assert_close(out, model(x, idx), rtol=1e-4, atol=1e-4)


def test_adaptive_avg_pool_exports_or_says_why():
    class Head(nn.Module):
        def __init__(self, size) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.size = size

        def forward(self, x):
            return torch.flatten(F.adaptive_avg_pool2d(self.conv(x), self.size), 1) * 2

    x = torch.randn(1, 3, 12, 12)
    for size, cpu in (((6, 6), False), ((12, 12), False), ((5, 7), True)):
        torch._dynamo.reset()
        model = Head(size).eval()
        with report.collect() as reps, torch.no_grad():
            out = compile_bpu(model, executor="sim", calibrate="first-call")(x)
        rep = report.Report(list(reps))
        reasons = [n["reason"] for n in rep.cpu_nodes]
        assert cosine(out, model(x)) > 0.999, rep.table()
        if cpu:  # not a divisor: refused before partitioning, with the reason
            assert any(r.startswith("export: adaptive_avg_pool2d") for r in reasons), reasons
        else:  # lowered to avg_pool2d: one partition, all of it
            assert rep.coverage_pct == 100.0 and reps[0].rewrites["adaptive_avg_pool"] == 1

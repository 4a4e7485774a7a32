"""A byte clamp after the extension's pair GEMM, one-row GEMM, depthwise and grouped conv ops
(both grouped ops: float multiply-adds and VNNI byte dot products) folded into their output step
(conversion/clamp_fold.py, csrc/runtime/ort_requant.h): in real sessions, the folded graph
against ORT's own conv followed by the clamp lookup, byte for byte, in both of the ops'
forms, for uint8 and int8, for clamps that cut one end, both ends or everything but one byte, a
chain of three clamps; what stays (a table that is not a clamp, an output read twice or a graph
output); the ops' refusal of bad bounds; and a compiled model, unchanged by the fold, whose
explain() counts it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tests.compile.test_grouped_conv import _grouped
from tests.support.sim_ops import (
    depthwise_qlinearconv,
    exact_reference,
    narrow_qlinearconv,
    op_session,
    random_input,
)
from torch_fl.bpu.conversion import session_graph as session_graph_module
from torch_fl.bpu.conversion.clamp_fold import BOUNDS_AT, clamp_of, fold_clamps
from torch_fl.bpu.conversion.depthwise import rewrite_depthwise
from torch_fl.bpu.conversion.gemv import rewrite_gemv
from torch_fl.bpu.conversion.grouped_conv import rewrite_grouped
from torch_fl.bpu.conversion.lookups import DOMAIN
from torch_fl.bpu.conversion.pair_gemm import rewrite_pair_gemm

pytest.importorskip("onnxruntime")

NP = {TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8}
LOOKUP = {TensorProto.UINT8: "LookupU8", TensorProto.INT8: "LookupI8"}


def _table(lo: int, hi: int, x_type: int, bend: bool = False) -> np.ndarray:
    """The 256-entry byte table clamping each byte's value to [lo, hi] (indexed by the raw byte);
    `bend` changes one entry inside the range, so that it is no clamp."""
    values = np.arange(256, dtype=np.uint8).view(NP[x_type]).astype(int)
    out = np.clip(values, lo, hi)
    if bend:
        inside = np.flatnonzero((values > lo) & (values < hi))[0]
        out[inside] += 1
    return out.astype(NP[x_type])


def _clamped(model: onnx.ModelProto, x_type: int, *bounds, bend=False) -> onnx.ModelProto:
    """`model` (one conv from "x" to "y") with a clamp lookup per (lo, hi) of `bounds` after it:
    the conv writes "c0", each clamp the next, the last "y"."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy.graph.node[0].output[0] = "c0"
    for i, (lo, hi) in enumerate(bounds):
        name = f"clamp{i}"
        copy.graph.initializer.append(
            numpy_helper.from_array(_table(lo, hi, x_type, bend), f"{name}/table")
        )
        out = "y" if i == len(bounds) - 1 else f"c{i + 1}"
        copy.graph.node.append(
            helper.make_node(
                LOOKUP[x_type], [f"{name}/table", f"c{i}"], [out], domain=DOMAIN, name=name
            )
        )
    copy.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return copy


def _pair_gemm(rng, x_type):
    shape = (1, 7, 9, 33)
    quant = dict(w_type=TensorProto.UINT8, pads=(0, 0, 0, 0))
    if x_type == TensorProto.INT8:
        quant = dict(x_type=x_type, zp_x=3, zp_y=-7, w_type=TensorProto.INT8, pads=(0, 0, 0, 0))
    model = narrow_qlinearconv(rng, shape, 40, (1, 1), **quant)
    return model, shape, lambda m, form: rewrite_pair_gemm(m, u8u8_only=False, form=form)


def _one_pixel(rng, x_type):
    """A 1x1 conv over one pixel (a squeeze-excitation block's at batch 1): the one-row op."""
    shape = (1, 1, 1, 96)
    quant = dict(pads=(0, 0, 0, 0))
    if x_type == TensorProto.INT8:
        quant.update(x_type=x_type, zp_x=3, zp_y=-7)
    model = narrow_qlinearconv(rng, shape, 64, (1, 1), **quant)
    return model, shape, lambda m, form: rewrite_gemv(m, {"conv": 1}, form=form)


def _depthwise(rng, x_type):
    shape = (2, 9, 9, 24)
    zp = dict(zp_x=5, zp_y=-3) if x_type == TensorProto.INT8 else {}
    model = depthwise_qlinearconv(rng, shape, (3, 3), x_type=x_type, **zp)
    return model, shape, lambda m, form: rewrite_depthwise(m, form=form, every_width=True)


def _grouped_conv(rng, x_type):
    shape = (1, 8, 8, 32)
    zp = dict(zp_x=5, zp_y=-3) if x_type == TensorProto.INT8 else {}
    model = _grouped(rng, shape, 32, 8, x_type=x_type, **zp)
    return model, shape, lambda m, form: rewrite_grouped(m, form=form, every_shape=True)


def _grouped_dot(outputs: int, width: int):
    """The dot op over 32 input channels in groups `width` wide, to `outputs` (its plain loop
    where the CPU has no VNNI): 32 outputs of groups 8 wide have each block of 16 read its own
    16 inputs (a permute), 64 outputs of groups 16 wide a broadcast word (ort_grouped_dot.cpp)."""

    def make(rng, x_type):
        shape = (2, 7, 9, 32)
        zp = dict(zp_x=5, zp_y=-3) if x_type == TensorProto.INT8 else {}
        model = _grouped(rng, shape, outputs, width, x_type=x_type, **zp)
        return (
            model,
            shape,
            lambda m, form: rewrite_grouped(m, form=form, every_shape=True, dot=True, floats=False),
        )

    return make


OPS = {
    "pair GEMM": _pair_gemm,
    "one-row GEMM": _one_pixel,
    "depthwise": _depthwise,
    "grouped": _grouped_conv,
    "grouped dot, permuted words": _grouped_dot(32, 8),
    "grouped dot, broadcast words": _grouped_dot(64, 16),
}
# (lo, hi) as the type's values: a ReLU's Max with the zero point, a ReLU6's Clip, one byte
BOUNDS = {
    TensorProto.UINT8: [(100, 255), (100, 180), (0, 37), (90, 90)],
    TensorProto.INT8: [(-3, 127), (-3, 60), (-128, -100), (10, 10)],
}


def _folded(model, rewrite, form):
    """(the model with its conv on the extension's op, the same with the clamps folded, how many
    folded)."""
    op = onnx.ModelProto()
    op.CopyFrom(model)
    assert rewrite(op, form) == 1
    folded = onnx.ModelProto()
    folded.CopyFrom(op)
    return op, folded, fold_clamps(folded)


@pytest.mark.parametrize("form", [0, 1], ids=["fastest", "portable"])
@pytest.mark.parametrize("x_type", [TensorProto.UINT8, TensorProto.INT8], ids=["u8", "i8"])
@pytest.mark.parametrize("kind", sorted(OPS))
def test_a_folded_clamp_gives_the_clamps_bytes(kind, x_type, form):
    rng = np.random.default_rng(0)
    conv, shape, rewrite = OPS[kind](rng, x_type)
    for bounds in BOUNDS[x_type]:
        model = _clamped(conv, x_type, bounds)
        op, folded, count = _folded(model, rewrite, form)
        assert count == 1
        assert len(folded.graph.node) == 1 and folded.graph.node[0].output[0] == "y"
        assert not any(i.name.endswith("/table") for i in folded.graph.initializer)
        x = random_input(np.random.default_rng(1), shape, x_type)
        expected = op_session(exact_reference(model)).run(None, {"x": x})[0]
        unclamped = op_session(exact_reference(conv)).run(None, {"x": x})[0]
        # the clamp changes bytes (the comparison means something)...
        assert not np.array_equal(expected, unclamped), bounds
        # ... and the folded op gives the clamp's, as the unfolded op does, on 1 and 2 threads
        assert op_session(op).run(None, {"x": x})[0].tobytes() == expected.tobytes()
        for threads in (1, 2):
            got = op_session(folded, threads).run(None, {"x": x})[0]
            assert got.tobytes() == expected.tobytes(), (bounds, threads)


@pytest.mark.parametrize("kind", sorted(OPS))
def test_a_chain_of_clamps_folds_into_one_op(kind):
    rng = np.random.default_rng(2)
    conv, shape, rewrite = OPS[kind](rng, TensorProto.UINT8)
    model = _clamped(conv, TensorProto.UINT8, (60, 250), (20, 200), (90, 255))
    _, folded, count = _folded(model, rewrite, 0)
    assert count == 3 and len(folded.graph.node) == 1
    geometry = next(i for i in folded.graph.initializer if i.name.endswith("/geometry"))
    values = numpy_helper.to_array(geometry).tolist()
    assert [90, 200] == [v for v in values if v in (90, 200)][:2]
    x = random_input(np.random.default_rng(3), shape, TensorProto.UINT8)
    expected = op_session(exact_reference(model)).run(None, {"x": x})[0]
    np.testing.assert_array_equal(op_session(folded).run(None, {"x": x})[0], expected)


def test_what_stays_a_lookup():
    rng = np.random.default_rng(4)
    conv, _, rewrite = _pair_gemm(rng, TensorProto.UINT8)
    # a table one entry off a clamp
    assert _folded(_clamped(conv, TensorProto.UINT8, (100, 200), bend=True), rewrite, 0)[2] == 0
    # the op's output read by another node too, or a graph output
    model = _clamped(conv, TensorProto.UINT8, (100, 200))
    model.graph.output.append(helper.make_tensor_value_info("c0", TensorProto.UINT8, None))
    assert _folded(model, rewrite, 0)[2] == 0
    # a lookup of the other type (an int8 table over the uint8 op's bytes)
    model = _clamped(conv, TensorProto.UINT8, (100, 200))
    model.graph.node[1].op_type = "LookupI8"
    assert fold_clamps(model) == 0
    # a clamp after ORT's own conv (not one of the extension's ops)
    assert fold_clamps(_clamped(conv, TensorProto.UINT8, (100, 200))) == 0


def test_clamp_of_reads_a_tables_bounds():
    assert clamp_of(_table(100, 200, TensorProto.UINT8), TensorProto.UINT8) == (100, 200)
    assert clamp_of(_table(-3, 127, TensorProto.INT8), TensorProto.INT8) == (-3, 127)
    assert clamp_of(np.arange(256, dtype=np.uint8), TensorProto.UINT8) == (0, 255)
    assert clamp_of(_table(100, 200, TensorProto.UINT8, bend=True), TensorProto.UINT8) is None
    assert clamp_of(np.arange(256, dtype=np.uint8)[::-1].copy(), TensorProto.UINT8) is None
    # the same bytes read as int8 are no clamp
    assert clamp_of(_table(100, 200, TensorProto.UINT8), TensorProto.INT8) is None


@pytest.mark.parametrize(
    "bounds,problem",
    [((200, 100), "lo <= hi"), ((-1, 255), "lo <= hi"), ((0, 256), "lo <= hi")],
)
def test_the_ops_refuse_bad_bounds(bounds, problem):
    rng = np.random.default_rng(5)
    for make in (_pair_gemm, _depthwise, _grouped_dot(32, 8), _one_pixel):
        conv, shape, rewrite = make(rng, TensorProto.UINT8)
        _, folded, _ = _folded(_clamped(conv, TensorProto.UINT8, (100, 200)), rewrite, 1)
        geometry = next(i for i in folded.graph.initializer if i.name.endswith("/geometry"))
        values = numpy_helper.to_array(geometry).tolist()
        at = BOUNDS_AT[folded.graph.node[0].op_type][2]
        assert values[at : at + 2] == [100, 200]
        values[at : at + 2] = bounds
        geometry.CopyFrom(numpy_helper.from_array(np.array(values, np.int64), geometry.name))
        x = random_input(rng, shape, TensorProto.UINT8)
        with pytest.raises(Exception, match=f"torch_fl.bpu .*{problem}"):
            op_session(folded).run(None, {"x": x})


class _ReluBlocks(torch.nn.Module):
    """A 1x1 conv over an un-Relu'd input and a ReLU6 (on an AVX2 host: the pair GEMM op, then a
    clamp), a depthwise conv of 24 channels and a ReLU (the depthwise op, then a clamp), a 1x1
    conv over that Relu'd input and a ReLU (ORT's own u8s8 conv: its clamp stays), a last 1x1
    conv."""

    def __init__(self) -> None:
        super().__init__()
        self.expand = torch.nn.Conv2d(8, 24, 1)
        self.dw = torch.nn.Conv2d(24, 24, 3, padding=1, groups=24)
        self.project = torch.nn.Conv2d(24, 16, 1)
        self.head = torch.nn.Conv2d(16, 16, 1)

    def forward(self, x):
        x = torch.nn.functional.relu6(self.expand(x))
        x = torch.relu(self.dw(x))
        return self.head(torch.relu(self.project(x)))


def test_compiled_model_is_unchanged_by_the_fold_and_explain_counts_it(monkeypatch):
    from torch_fl import bpu
    from torch_fl.bpu import report

    torch.manual_seed(0)
    model = _ReluBlocks().eval()
    x = torch.randn(2, 8, 12, 12)
    samples = [torch.randn(2, 8, 12, 12) for _ in range(3)]
    outs, counts, lines = {}, {}, {}
    for fold in (True, False):
        if not fold:
            monkeypatch.setattr(session_graph_module, "fold_clamps", lambda model: 0)
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="bpu", options={"executor": "sim", "cache": False})
        with report.collect() as reps:
            bpu.calibrate(compiled, samples)
            with torch.no_grad():
                outs[fold] = [compiled(x * s) for s in (1.0, 3.0, 0.2)]
        sims = [r for g in reps for r in g.runtimes if r.kind == "sim"]
        counts[fold] = sum(r._exec.folded_clamps for r in sims)
        lines[fold] = [s for s in report.Report(reps).table().splitlines() if "folded" in s]
    if counts[True] == 0:
        pytest.skip("this CPU runs these convs on ONNX Runtime's kernels: no op to fold into")
    assert counts[False] == 0 and not lines[False]
    n = counts[True]
    assert any(f": {n} byte clamp{'s' * (n != 1)} " in s for s in lines[True]), lines[True]
    for a, b in zip(outs[True], outs[False], strict=True):
        assert torch.equal(a, b)

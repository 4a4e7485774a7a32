"""The sim's exact 16-bit GEMM op (conversion/pair_gemm.py, csrc/runtime/ort_pair_gemm.cpp)
against ONNX Runtime's own channels-last 1x1 QLinearConv and QGemm, byte for byte or float for
float, in real sessions: x's type and zero point, uint8 and int8 weights, per-tensor and
per-channel scales, bias or none, y's zero point, float y, odd K, output counts off the op's
blocks of 16 and 8, row counts off its register tiles, 1 and 2 threads, the AVX2 form and the
plain loop; then the rewrite's limits, its errors and a compiled model.

The reference is ORT's u8u8 kernels (`exact_reference`), exact on every CPU; on this project's
AVX-512 host the op's AVX2 form runs here too (`_pair_gemm_kernel()`), and the sim takes the op
only where its kernels are ORT's u8u8 ones: tests/compile/test_ops_avx2.py runs this file again
as an AVX2-only CPU, where the compiled model's convs move."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tests.support.sim_ops import (
    compiled_both_ways,
    exact_reference,
    narrow_qlinearconv,
    op_session,
    qgemm,
    random_input,
)
from torch_fl import _C
from torch_fl.bpu.conversion.pair_gemm import (
    LARGE_WEIGHTS,
    OPS,
    SHORT_ROWS,
    candidates,
    pack_pairs,
    rewrite_pair_gemm,
    stays_short,
)
from torch_fl.bpu.runtime.executors import takes_pair_gemms

ort = pytest.importorskip("onnxruntime")


def _conv(rng, shape, outputs, **kw) -> onnx.ModelProto:
    """One channels-last 1x1 QLinearConv over NHWC `shape` (uint8 weights unless told)."""
    kw.setdefault("w_type", TensorProto.UINT8)
    kw.setdefault("pads", (0, 0, 0, 0))
    return narrow_qlinearconv(rng, shape, outputs, (1, 1), **kw)


def _both(model, x, form=0, threads=1, u8u8_only=True):
    """(ORT's exact output for `model`, the PairGemm op's, the rewritten graph's op types)."""
    expected = op_session(exact_reference(model), threads).run(None, {"x": x})[0]
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert rewrite_pair_gemm(rewritten, u8u8_only=u8u8_only, form=form) == 1
    got = op_session(rewritten, threads).run(None, {"x": x})[0]
    return expected, got, [n.op_type for n in rewritten.graph.node]


CONV_QUANT = [
    dict(),
    dict(zp_x=0, zp_y=0),
    dict(zp_x=255, zp_y=255, per_channel=False),
    dict(bias=False),
    dict(w_type=TensorProto.INT8),  # int8 weights: taken where u8u8_only is off
    # int8 x (ORT has no int8 x with uint8 weights)
    dict(x_type=TensorProto.INT8, zp_x=0, zp_y=-5, w_type=TensorProto.INT8),
    dict(x_type=TensorProto.INT8, zp_x=-128, zp_y=127, w_type=TensorProto.INT8),
    dict(x_type=TensorProto.INT8, zp_x=17, zp_y=-128, per_channel=False, w_type=TensorProto.INT8),
    dict(bias_scale=1_000_000),
]
# NHWC shapes and output counts: MobileNetV3's 16 -> 72 (smaller), odd K, fewer outputs than a
# vector, half a block (24 = 16 + 8), rows off the register tile of 6 and the tile of 48
CONV_SIZES = [
    ((1, 9, 11, 16), 72),
    ((2, 5, 7, 3), 5),
    ((1, 4, 4, 40), 24),
    ((1, 7, 7, 33), 17),
    ((3, 1, 1, 96), 40),
    ((1, 7, 9, 65), 130),
]


@pytest.mark.parametrize("form", [0, 1], ids=["fastest", "portable"])
@pytest.mark.parametrize(
    "quant", CONV_QUANT, ids=lambda q: ",".join(f"{k}={v}" for k, v in q.items()) or "default"
)
@pytest.mark.parametrize("size", CONV_SIZES, ids=str)
def test_op_is_the_1x1_qlinearconv_byte_for_byte(size, quant, form):
    shape, outputs = size
    rng = np.random.default_rng(shape[-1] * 1000 + outputs)
    model = _conv(rng, shape, outputs, **quant)
    x_type = quant.get("x_type", TensorProto.UINT8)
    for seed in range(2):
        x = random_input(np.random.default_rng(seed), shape, x_type)
        expected, got, ops = _both(model, x, form, u8u8_only=False)
        assert ops == [OPS[(x_type, False)]]
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert got.shape == (*shape[:3], outputs)
        np.testing.assert_array_equal(got, expected)
    if outputs >= 17 and shape[-1] >= 16:
        assert len(np.unique(expected)) > 20  # not trivially saturated


GEMM_QUANT = [
    dict(),
    dict(float_out=False),
    dict(float_out=False, zp_y=0, per_column=False),
    dict(zp_a=0, bias=False, alpha=0.5),
    dict(trans_b=False),
    dict(a_type=TensorProto.INT8, zp_a=0, w_type=TensorProto.INT8),
    dict(a_type=TensorProto.INT8, zp_a=-128, float_out=False, zp_y=-5, w_type=TensorProto.INT8),
    dict(w_type=TensorProto.INT8, float_out=False),
]


@pytest.mark.parametrize("form", [0, 1], ids=["fastest", "portable"])
@pytest.mark.parametrize(
    "quant", GEMM_QUANT, ids=lambda q: ",".join(f"{k}={v}" for k, v in q.items()) or "default"
)
@pytest.mark.parametrize("size", [(197, 64, 48), (5, 37, 33), (1, 4, 16), (13, 130, 71)], ids=str)
def test_op_is_the_qgemm_byte_for_byte(size, quant, form):
    rows, k, n = size
    rng = np.random.default_rng(rows * 100 + k)
    quant = {"w_type": TensorProto.UINT8, **quant}
    model = qgemm(rng, k, n, rows=rows, **quant)
    a_type = quant.get("a_type", TensorProto.UINT8)
    float_out = quant.get("float_out", True)
    for seed in range(2):
        x = random_input(np.random.default_rng(seed), (rows, k), a_type)
        expected, got, ops = _both(model, x, form, u8u8_only=False)
        assert ops == [OPS[(a_type, float_out)]]
        assert got.dtype == expected.dtype and got.shape == expected.shape == (rows, n)
        np.testing.assert_array_equal(got, expected)


def _qlinear_matmul(
    rng,
    shape,
    n,
    x_type=TensorProto.UINT8,
    zp_x=128,
    zp_y=100,
    w_type=TensorProto.UINT8,
    per_column=True,
) -> onnx.ModelProto:
    """One QLinearMatMul (ai.onnx) from x of `shape` (..., K) by a constant [K, n] B."""
    k = shape[-1]
    b = rng.integers(-127, 128, (k, n))
    b, zero = (
        (b.astype(np.int8), 0) if w_type == TensorProto.INT8 else ((b + 128).astype(np.uint8), 128)
    )
    dtype = {TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8}
    b_scale = rng.uniform(0.001, 0.02, n if per_column else 1).astype(np.float32)
    a_scale = np.float32(rng.uniform(0.005, 0.05))
    inits = [
        numpy_helper.from_array(np.array(a_scale, np.float32), "as"),
        numpy_helper.from_array(np.array(zp_x, dtype[x_type]), "az"),
        numpy_helper.from_array(b, "b"),
        numpy_helper.from_array(b_scale if per_column else b_scale.reshape(()), "bs"),
        numpy_helper.from_array(
            np.full(n, zero, b.dtype) if per_column else np.array(zero, b.dtype), "bz"
        ),
        numpy_helper.from_array(
            np.array(a_scale * b_scale.mean() * np.sqrt(k) * 80, np.float32), "ys"
        ),
        numpy_helper.from_array(np.array(zp_y, dtype[x_type]), "yz"),
    ]
    node = helper.make_node(
        "QLinearMatMul", ["x", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"], name="mm"
    )
    graph = helper.make_graph(
        [node], "mm", [helper.make_tensor_value_info("x", x_type, list(shape))],
        [helper.make_tensor_value_info("y", x_type, None)], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("form", [0, 1], ids=["fastest", "portable"])
@pytest.mark.parametrize(
    "quant",
    [
        dict(),
        dict(zp_x=0, zp_y=255, per_column=False),
        dict(w_type=TensorProto.INT8),
        dict(x_type=TensorProto.INT8, zp_x=-3, zp_y=5, w_type=TensorProto.INT8),
    ],
    ids=lambda q: ",".join(f"{k}={v}" for k, v in q.items()) or "default",
)
@pytest.mark.parametrize("size", [((1, 197, 64), 48), ((3, 5, 37), 33), ((7, 130), 71)], ids=str)
def test_op_is_the_qlinearmatmul_byte_for_byte(size, quant, form):
    """ViT's linear layers over [batch, tokens, features] reach ORT as QLinearMatMul."""
    shape, n = size
    rng = np.random.default_rng(shape[-1] * 100 + n)
    model = _qlinear_matmul(rng, shape, n, **quant)
    x_type = quant.get("x_type", TensorProto.UINT8)
    for seed in range(2):
        x = random_input(np.random.default_rng(seed), shape, x_type)
        expected, got, ops = _both(model, x, form, u8u8_only=False)
        assert ops == [OPS[(x_type, False)]]
        assert got.dtype == expected.dtype and got.shape == expected.shape == (*shape[:-1], n)
        np.testing.assert_array_equal(got, expected)
    assert len(np.unique(expected)) > 20  # not trivially saturated


@pytest.mark.parametrize(
    "shape,n,pieces",
    [
        ((2, 56, 56, 16), 72, 4),
        # MobileNetV3-Small's 72 -> 24 at 28x28, batch 1: 1.8 M multiply-adds, one piece under
        # the earlier bound of 2^20 (ort_pair_gemm.cpp kMinPieceWork)
        ((1, 28, 28, 72), 24, 2),
    ],
)
def test_rows_split_over_two_threads_are_the_same(shape, n, pieces):
    """A 1x1 conv's rows split into pieces (kMinPieceWork, ort_pair_gemm.cpp) that the
    session's threads share; split, its bytes are ORT's."""
    rng = np.random.default_rng(3)
    model = _conv(rng, shape, n)
    x = random_input(rng, shape, TensorProto.UINT8)
    before = _C._pair_gemm_pieces()
    expected, got, _ = _both(model, x, threads=2)
    assert _C._pair_gemm_pieces() - before >= pieces
    np.testing.assert_array_equal(got, expected)


def _initializer(model: onnx.ModelProto, name: str) -> onnx.TensorProto:
    return next(i for i in model.graph.initializer if i.name == name)


def test_what_stays_onnx_runtimes():
    rng = np.random.default_rng(5)
    shape = (1, 6, 6, 8)
    # not a 1x1 conv of stride 1 without pads, or more than one group
    assert rewrite_pair_gemm(narrow_qlinearconv(rng, shape, 8, (3, 3), w_type=2)) == 0
    assert rewrite_pair_gemm(_conv(rng, shape, 8, strides=(2, 2))) == 0
    assert rewrite_pair_gemm(_conv(rng, shape, 8, pads=(1, 1, 1, 1))) == 0
    model = _conv(rng, shape, 8)
    weights = numpy_helper.to_array(_initializer(model, "w"))[:, :4]
    _initializer(model, "w").CopyFrom(numpy_helper.from_array(weights, "w"))
    model.graph.node[0].attribute.append(helper.make_attribute("group", 2))
    assert rewrite_pair_gemm(model) == 0
    # int8 weights: ORT's u8s8 kernels, left to ORT where only the u8u8 ones are asked for
    assert rewrite_pair_gemm(_conv(rng, shape, 8, w_type=TensorProto.INT8)) == 0
    assert rewrite_pair_gemm(qgemm(rng, 32, 16, rows=4)) == 0
    # weights not a constant
    model = qgemm(rng, 32, 16, rows=4, w_type=TensorProto.UINT8)
    model.graph.initializer.remove(_initializer(model, "b"))
    assert rewrite_pair_gemm(model) == 0
    # A transposed
    model = qgemm(rng, 32, 16, rows=4, w_type=TensorProto.UINT8)
    model.graph.node[0].attribute.append(helper.make_attribute("transA", 1))
    assert rewrite_pair_gemm(model) == 0
    # a bias that takes a partial sum past int32
    model = _conv(rng, shape, 8)
    bias = numpy_helper.to_array(_initializer(model, "b")).copy()
    bias[3] = 2**31 - 100
    _initializer(model, "b").CopyFrom(numpy_helper.from_array(bias, "b"))
    assert rewrite_pair_gemm(model) == 0
    assert [n.op_type for n in model.graph.node] == ["QLinearConv"]


def test_bad_inputs_name_the_op_and_the_problem():
    rng = np.random.default_rng(1)
    model = _conv(rng, (1, 4, 4, 16), 24)
    assert rewrite_pair_gemm(model) == 1
    x = random_input(rng, (1, 4, 4, 16), TensorProto.UINT8)
    model.graph.input[0].type.tensor_type.shape.dim[3].dim_param = "channels"  # any K reaches it
    session = op_session(model)
    # x whose last dimension is not the weights' K
    with pytest.raises(Exception, match=r"PairGemmU8: x must be .* last dimension is K = 16"):
        session.run(None, {"x": random_input(rng, (1, 4, 4, 15), TensorProto.UINT8)})
    geometry = next(i for i in model.graph.initializer if i.name.endswith("/geometry"))
    values = numpy_helper.to_array(geometry).copy()
    values[2] = 7  # no such form
    geometry.CopyFrom(numpy_helper.from_array(values, geometry.name))
    with pytest.raises(Exception, match="PairGemmU8: geometry out of range"):
        op_session(model).run(None, {"x": x})
    values[2], values[0] = 0, 18  # K that the weights do not hold
    geometry.CopyFrom(numpy_helper.from_array(values, geometry.name))
    with pytest.raises(Exception, match=r"PairGemmU8: (x must be|weights must be)"):
        op_session(model).run(None, {"x": x})


@pytest.mark.parametrize(
    ("k", "n", "rows", "moves"),
    [
        (1024, 1000, 1, False),  # a classifier at batch 1: 2 MB of int16 pairs, one row
        (1024, 1000, SHORT_ROWS - 1, False),
        (1024, 1000, SHORT_ROWS, True),  # a whole tile of rows
        (1024, 1000, None, True),  # rows unknown: the op, as before the rule
        (384, 1152, 1, True),  # under LARGE_WEIGHTS
        (96, 576, 1, True),
    ],
)
def test_short_gemms_of_large_weights_stay_onnx_runtimes(k, n, rows, moves):
    rng = np.random.default_rng(k + n)
    model = qgemm(rng, k, n, rows=rows or 1, w_type=TensorProto.UINT8, float_out=False)
    known = {} if rows is None else {"fc": rows}
    assert rewrite_pair_gemm(model, rows=known) == int(moves)
    assert stays_short(rows, k, n) == (not moves)
    # the bound is on the op's packed bytes: K pairs by N in blocks of 16, two bytes each
    assert stays_short(1, 2, LARGE_WEIGHTS // 4 + 16) and not stays_short(1, 2, LARGE_WEIGHTS // 4)


def test_pack_pairs_layout():
    w = np.arange(5 * 20, dtype=np.int64).reshape(5, 20) - 50  # [K, N]
    packed = pack_pairs(w)
    assert packed.shape == (2, 3, 16, 2) and packed.dtype == np.int16
    # block b, pair p, lane l, j: w[2p + j, 16b + l], zeros past K and N
    assert packed[1, 2, 3, 0] == w[4, 19] and packed[1, 2, 3, 1] == 0
    assert packed[0, 1, 5, 1] == w[3, 5]
    assert not packed[1, :, 4:].any()


def test_candidates_count_1x1_convs_and_gemms_of_the_integer_graph():
    rng = np.random.default_rng(2)
    assert candidates(qgemm(rng, 8, 8)) == 1
    assert candidates(narrow_qlinearconv(rng, (1, 4, 4, 3), 8, (3, 3))) == 0


class _Pointwise(torch.nn.Module):
    """1x1 convs after hardswish (no Relu bounds their input: ORT's u8u8 kernels on the `mixed`
    path), and one after a Relu (u8s8, exact there: left to ORT)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.Hardswish(),
            torch.nn.Conv2d(16, 40, 1), torch.nn.Hardswish(),
            torch.nn.Conv2d(40, 24, 1), torch.nn.ReLU(),
            torch.nn.Conv2d(24, 16, 1),
        )  # fmt: skip

    def forward(self, x):
        return self.body(x)


def test_compiled_model_is_unchanged_by_the_op_and_explain_counts_it():
    torch.manual_seed(0)
    model = _Pointwise().eval()
    x = torch.randn(2, 3, 20, 24)
    samples = [torch.randn(2, 3, 20, 24) for _ in range(3)]
    outs, runtimes, lines = compiled_both_ways(model, x, samples, "sim_pair_gemm", "pair GEMM")
    sims = runtimes[True]
    moves = takes_pair_gemms(sims[0]._exec.kernels.path)
    moved = sum(r._exec.pair_gemms for r in sims)
    assert sum(r._exec.pair_gemms for r in runtimes[False]) == 0
    if moves:
        # the two after hardswish; on the u8u8 path the one after the Relu too
        assert moved == (2 if sims[0]._exec.kernels.path == "mixed" else 3)
        assert any(f"{moved} 1x1 int8 convs or GEMMs with uint8 weights" in s for s in lines[True])
    else:
        assert moved == 0 and not lines[True]
    assert not lines[False]
    for a, b in zip(outs[True], outs[False], strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["tv_mobilenet_v2", "hf_bert"])
def test_public_models_give_the_same_outputs_with_and_without_the_op(name):
    """Networks nobody here wrote, conv and transformer: on an AVX2-only CPU (test_ops_avx2 runs
    this file again as one) their 1x1 convs or linear layers move to the op and every output stays
    bit-equal to ORT's own kernels'; elsewhere none moves."""
    from tests.support import public_zoo as zoo

    if not zoo.available(zoo.MODELS[name].library):
        pytest.skip(f"{zoo.MODELS[name].library} is not installed")
    model, inputs = zoo.build(name)
    runs, calib = zoo.samples(inputs, 2, seed=2), zoo.samples(inputs, 3, seed=1)
    outs, runtimes, lines = compiled_both_ways(model, runs, calib, "sim_pair_gemm", "pair GEMM")
    moved = {v: sum(r._exec.pair_gemms for r in runtimes[v]) for v in (True, False)}
    assert moved[False] == 0 and not lines[False]
    if any(takes_pair_gemms(r._exec.kernels.path) for r in runtimes[True]):
        assert moved[True] > 0 and lines[True]
    else:
        assert moved[True] == 0 and not lines[True]
    for got, want in zip(outs[True], outs[False], strict=True):
        got, want = zoo.output_tensors(got), zoo.output_tensors(want)
        assert len(got) == len(want) > 0
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b)


def test_the_benchmarks_breakdown_counts_the_nodes_the_executor_moved(tmp_path):
    """scripts/bench_sim.py's node counts read the graph the session opened: each node moved to
    the op is counted there, as a fused integer node (they once came from a graph rebuilt
    without the op, and ViT-S/16's 48 moved GEMMs read as ORT's QGemm)."""
    from scripts import bench_sim

    torch.manual_seed(0)
    model = _Pointwise().eval()
    x = torch.randn(2, 3, 20, 24)
    samples = [torch.randn(2, 3, 20, 24) for _ in range(3)]
    _, runtimes, _ = compiled_both_ways(model, x, samples, "sim_pair_gemm", "pair GEMM")
    runtime = runtimes[True][0]
    counts = bench_sim._fused_counts(runtime, 1, tmp_path)
    executor = runtime._exec
    for key in bench_sim.MOVED:
        assert counts[key] == getattr(executor, key)
    # the graph counted is the session's: the moved nodes are in it, as the op (7 node types
    # here, so top_ops lists them all)
    assert counts["top_ops"].get("PairGemmU8", 0) == executor.pair_gemms
    moved = sum(counts[k] for k in bench_sim.MOVED if k not in ("lookups", "lookup_means"))
    assert counts["fused_integer_nodes"] >= moved
    if takes_pair_gemms(executor.kernels.path):
        assert counts["pair_gemms"] == 2


@pytest.mark.parametrize(("rows", "moved"), [(1, 1), (SHORT_ROWS, 2)])
def test_a_compiled_classifier_of_large_weights_stays_onnx_runtimes_at_few_rows(rows, moved):
    """The integer graph's shapes reach the rewrite: at one row the 1024 -> 1000 layer (2 MB of
    int16 pairs) stays ORT's, at a whole tile of rows it moves; the small layer moves at both
    (where the sim takes the op at all: an AVX2-only CPU, as test_ops_avx2 runs this file), and
    the outputs are those of the op off, bit for bit."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 1024), torch.nn.Hardswish(), torch.nn.Linear(1024, 1000)
    ).eval()
    runs = [(torch.randn(rows, 64),)]
    samples = [torch.randn(rows, 64) for _ in range(2)]
    outs, runtimes, _ = compiled_both_ways(model, runs, samples, "sim_pair_gemm", "pair GEMM")
    want = moved if takes_pair_gemms(runtimes[True][0]._exec.kernels.path) else 0
    assert sum(r._exec.pair_gemms for r in runtimes[True]) == want
    assert sum(r._exec.pair_gemms for r in runtimes[False]) == 0
    assert torch.equal(outs[True][0], outs[False][0])

"""The sim's one-row 8-bit GEMM op (conversion/gemv.py, csrc/runtime/ort_gemv.cpp) against ONNX
Runtime's own QGemm, byte for byte or float for float, in real sessions: a's type and zero
point, float or 8-bit y, y's zero point, alpha, B transposed or not, per-tensor and per-column
scales, bias or none, sizes off the op's blocks, 1 and 2 threads, the VNNI form and the plain
loop; the same for 1x1 QLinearConvs over one pixel (a squeeze-excitation block's at batch 1)
against ORT's QLinearConv; then the rewrite's limits, its errors, the row counts it reads from
the integer graph, and compiled models."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from tests.support.sim_ops import (
    exact_reference,
    narrow_qlinearconv,
    op_session,
    qgemm,
    random_input,
)
from torch_fl import _C
from torch_fl.bpu.conversion import session_graph as session_graph_module
from torch_fl.bpu.conversion.gemv import (
    OPS,
    candidates,
    gemm_rows,
    pack_weights,
    rewrite_gemv,
    rows_of,
)
from torch_fl.bpu.conversion.inferred_shapes import InferredShapes, inferred_shapes
from torch_fl.bpu.runtime import sim_kernels

ort = pytest.importorskip("onnxruntime")

# ORT's QGemm is the reference only where its u8s8 kernels are exact: without VNNI they add
# pairs in saturating int16 (runtime/sim_kernels.py), and the op, which is exact, differs
qgemm_exact = pytest.mark.skipif(
    sim_kernels.probe("u8s8") is not None,
    reason="ORT's u8s8 QGemm saturates on this CPU: no exact reference",
)


def _both(model: onnx.ModelProto, x: np.ndarray, form: int = 0, threads: int = 1):
    """(ORT's QGemm output, the Gemv op's, the rewritten graph's op types)."""
    expected = op_session(model, threads).run(None, {"x": x})[0]
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert rewrite_gemv(rewritten, {"fc": 1}, form=form) == 1
    got = op_session(rewritten, threads).run(None, {"x": x})[0]
    return expected, got, [n.op_type for n in rewritten.graph.node]


QUANT = [
    dict(),
    dict(float_out=False),
    dict(float_out=False, zp_y=0),
    dict(float_out=False, zp_y=255, per_column=False),
    dict(zp_a=0, bias=False),
    dict(zp_a=255, alpha=0.5),
    dict(trans_b=False, per_column=False),
    dict(a_type=TensorProto.INT8, zp_a=0),
    dict(a_type=TensorProto.INT8, zp_a=-128, float_out=False, zp_y=-5),
    dict(a_type=TensorProto.INT8, zp_a=17, float_out=False, zp_y=127, trans_b=False),
    dict(bias_scale=2_000_000),  # large biases, still inside int32 with every product
]


@pytest.mark.parametrize("form", [0, 1], ids=["fastest", "portable"])
@pytest.mark.parametrize("quant", QUANT, ids=lambda q: ",".join(f"{k}={v}" for k, v in q.items()))
@pytest.mark.parametrize("size", [(576, 1024), (37, 33), (4, 16), (130, 71)], ids=str)
@qgemm_exact
def test_op_is_qgemm_byte_for_byte(size, quant, form):
    k, n = size
    rng = np.random.default_rng(k * 1000 + n)
    model = qgemm(rng, k, n, **quant)
    a_type = quant.get("a_type", TensorProto.UINT8)
    float_out = quant.get("float_out", True)
    for seed in range(3):
        x = random_input(np.random.default_rng(seed), (1, k), a_type)
        expected, got, ops = _both(model, x, form)
        assert ops == [OPS[(a_type, float_out)]]
        assert got.dtype == expected.dtype and got.shape == expected.shape == (1, n)
        np.testing.assert_array_equal(got, expected)
    if not float_out and n >= 33:
        assert len(np.unique(expected)) > 10  # not trivially saturated


@qgemm_exact
def test_split_over_two_threads_is_the_same():
    """MobileNetV3-Small's 1024 -> 1000 classifier splits into pieces of columns (kMinPieceWork,
    ort_gemv.cpp), which the session's threads share; split, its floats are ORT's."""
    rng = np.random.default_rng(3)
    model = qgemm(rng, 1024, 1000)
    x = random_input(rng, (1, 1024), TensorProto.UINT8)
    before = _C._gemv_pieces()
    expected, got, _ = _both(model, x, threads=2)
    assert _C._gemv_pieces() - before >= 2
    np.testing.assert_array_equal(got, expected)


@qgemm_exact
def test_more_rows_than_one_give_qgemms_numbers():
    """The rewrite takes one-row GEMMs only, but the op is right for any row count (a graph
    whose batch changed under it must not give wrong numbers)."""
    rng = np.random.default_rng(4)
    model = qgemm(rng, 64, 40, rows=5, float_out=False)
    x = random_input(rng, (5, 64), TensorProto.UINT8)
    expected, got, _ = _both(model, x)
    np.testing.assert_array_equal(got, expected)


CONV_QUANT = [
    dict(),
    dict(zp_x=0, zp_y=255, per_channel=False),
    dict(bias=False, zp_y=3),
    dict(w_type=TensorProto.UINT8),  # uint8 weights with zero point 128: int8 taps
    dict(x_type=TensorProto.INT8, zp_x=0, zp_y=-128),
    dict(x_type=TensorProto.INT8, zp_x=-40, zp_y=17, bias_scale=2_000_000),
]


def _one_pixel_conv(rng, channels: int, outputs: int, **quant) -> onnx.ModelProto:
    return narrow_qlinearconv(rng, (1, 1, 1, channels), outputs, (1, 1), pads=(0, 0, 0, 0), **quant)


@pytest.mark.parametrize("form", [0, 1], ids=["fastest", "portable"])
@pytest.mark.parametrize(
    "quant", CONV_QUANT, ids=lambda q: ",".join(f"{k}={v}" for k, v in q.items()) or "default"
)
@pytest.mark.parametrize("size", [(576, 144), (16, 8), (72, 288), (37, 33)], ids=str)
def test_op_is_a_one_pixel_qlinearconv_byte_for_byte(size, quant, form):
    """The conv's [1, 1, 1, K] input as the op's one row: its bytes and shape are ORT's
    QLinearConv's (its u8u8 form where this CPU's u8s8 kernels saturate: `exact_reference`)."""
    k, n = size
    rng = np.random.default_rng(k * 7 + n)
    model = _one_pixel_conv(rng, k, n, **quant)
    x_type = quant.get("x_type", TensorProto.UINT8)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert rewrite_gemv(rewritten, {"conv": 1}, form=form) == 1
    assert [n.op_type for n in rewritten.graph.node] == [OPS[(x_type, False)]]
    seen = set()
    for seed in range(4):
        x = random_input(np.random.default_rng(seed), (1, 1, 1, k), x_type)
        expected = op_session(exact_reference(model)).run(None, {"x": x})[0]
        for threads in (1, 2):
            got = op_session(rewritten, threads).run(None, {"x": x})[0]
            assert got.dtype == expected.dtype and got.shape == expected.shape == (1, 1, 1, n)
            assert got.tobytes() == expected.tobytes(), (seed, threads)
        seen.update(np.unique(expected).tolist())
    if n >= 33 and "bias_scale" not in quant:  # large biases saturate most outputs
        assert len(seen) > 10  # not trivially saturated


def test_a_conv_over_many_pixels_keeps_its_shape_and_numbers():
    """The rewrite takes one pixel only, but the op reads every leading dimension as rows and
    gives them back (a graph whose batch or image changed under it must not go wrong)."""
    rng = np.random.default_rng(8)
    shape = (2, 3, 5, 40)
    model = narrow_qlinearconv(rng, shape, 24, (1, 1), pads=(0, 0, 0, 0))
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert rewrite_gemv(rewritten, {"conv": 1}) == 1
    x = random_input(rng, shape, TensorProto.UINT8)
    expected = op_session(exact_reference(model)).run(None, {"x": x})[0]
    got = op_session(rewritten).run(None, {"x": x})[0]
    assert got.shape == expected.shape == (2, 3, 5, 24)
    np.testing.assert_array_equal(got, expected)


def test_convs_the_op_does_not_take_stay_onnx_runtimes():
    rng = np.random.default_rng(9)

    def conv(**kw):
        kernel = kw.pop("kernel", (1, 1))
        return narrow_qlinearconv(rng, (1, 3, 3, 16), 8, kernel, **{"pads": (0, 0, 0, 0), **kw})

    assert rewrite_gemv(conv(), {}) == 0  # no row count known
    assert rewrite_gemv(conv(), {"conv": 9}) == 0  # 9 pixels
    assert rewrite_gemv(conv(kernel=(3, 3), pads=(1, 1, 1, 1)), {"conv": 1}) == 0
    assert rewrite_gemv(conv(strides=(2, 2)), {"conv": 1}) == 0
    assert rewrite_gemv(conv(pads=(1, 1, 1, 1)), {"conv": 1}) == 0
    # taps outside int8: uint8 weights whose zero point is 0
    model = conv(w_type=TensorProto.UINT8)
    zero = _initializer(model, "wz")
    zero.CopyFrom(numpy_helper.from_array(np.zeros(8, np.uint8), "wz"))
    assert rewrite_gemv(model, {"conv": 1}) == 0
    # two groups
    model = narrow_qlinearconv(rng, (1, 1, 1, 16), 8, (1, 1), pads=(0, 0, 0, 0))
    w = _initializer(model, "w")
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w)[:, :8].copy(), "w"))
    model.graph.node[0].attribute.append(helper.make_attribute("group", 2))
    assert rewrite_gemv(model, {"conv": 1}) == 0
    assert [n.op_type for n in model.graph.node] == ["QLinearConv"]


def test_gemm_rows_counts_a_pointwise_convs_pixels_and_finds_ors_layout_names():
    """A 1x1 Conv's rows are its output's pixels, batch included; a 3x3 one has none; ORT's
    layout pass names the channels-last QLinearConv `<name>_token_<n>`."""
    inits = [
        numpy_helper.from_array(np.zeros((8, 4, 1, 1), np.float32), "w1"),
        numpy_helper.from_array(np.zeros((8, 8, 3, 3), np.float32), "w3"),
        numpy_helper.from_array(np.array([2, 3], np.int64), "axes"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="/pw"),
        helper.make_node("Conv", ["a", "w3"], ["b"], name="/k3", pads=[1, 1, 1, 1]),
        helper.make_node("ReduceMean", ["b", "axes"], ["m"], keepdims=1),
    ]
    nodes.append(helper.make_node("Conv", ["m", "w1_se"], ["s"], name="/se"))
    inits.append(numpy_helper.from_array(np.zeros((6, 8, 1, 1), np.float32), "w1_se"))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 5, 3])],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    rows = gemm_rows(model)
    assert rows == {"/pw": 30, "/se": 2}  # 2 x 5 x 3 pixels; the mean over H, W: 1 a batch item
    assert candidates(rows) == 0
    optimized = helper.make_node("QLinearConv", ["x"], ["y"], name="/se_token_17")
    assert rows_of(optimized, {"/se": 1}) == 1
    assert rows_of(optimized, {}) is None
    # only a conv's name is derived; a QGemm keeps its own
    assert rows_of(helper.make_node("QGemm", ["x"], ["y"], name="/se_token_17"), {"/se": 1}) is None


def _initializer(model: onnx.ModelProto, name: str) -> onnx.TensorProto:
    return next(i for i in model.graph.initializer if i.name == name)


def test_what_stays_onnx_runtimes():
    rng = np.random.default_rng(5)
    # more than one row, or an unknown row count
    assert rewrite_gemv(qgemm(rng, 32, 16, rows=8), {"fc": 8}) == 0
    assert rewrite_gemv(qgemm(rng, 32, 16), {}) == 0
    # B with a zero point other than 0
    model = qgemm(rng, 32, 16)
    _initializer(model, "bz").CopyFrom(numpy_helper.from_array(np.full(16, 3, np.int8), "bz"))
    assert rewrite_gemv(model, {"fc": 1}) == 0
    # B not a constant
    model = qgemm(rng, 32, 16)
    model.graph.initializer.remove(_initializer(model, "b"))
    assert rewrite_gemv(model, {"fc": 1}) == 0
    # A transposed
    model = qgemm(rng, 32, 16)
    model.graph.node[0].attribute.append(helper.make_attribute("transA", 1))
    assert rewrite_gemv(model, {"fc": 1}) == 0
    # y with a scale but no zero point (or the reverse): not a form ORT's optimizer writes
    model = qgemm(rng, 32, 16, float_out=False)
    model.graph.node[0].input[8] = ""
    assert rewrite_gemv(model, {"fc": 1}) == 0
    # a bias that takes a partial sum past int32
    model = qgemm(rng, 32, 16)
    c = numpy_helper.to_array(_initializer(model, "c")).copy()
    c[3] = 2**31 - 100
    _initializer(model, "c").CopyFrom(numpy_helper.from_array(c, "c"))
    assert rewrite_gemv(model, {"fc": 1}) == 0
    assert [n.op_type for n in model.graph.node] == ["QGemm"]


def test_bad_inputs_name_the_op_and_the_problem():
    rng = np.random.default_rng(1)
    model = qgemm(rng, 32, 16)
    rewrite_gemv(model, {"fc": 1})
    geometry = next(i for i in model.graph.initializer if i.name.endswith("/geometry"))
    values = numpy_helper.to_array(geometry).copy()
    values[2] = 7  # no such form
    geometry.CopyFrom(numpy_helper.from_array(values, geometry.name))
    with pytest.raises(Exception, match="GemvU8F: geometry out of range"):
        op_session(model).run(None, {"x": random_input(rng, (1, 32), TensorProto.UINT8)})
    model = qgemm(rng, 32, 16)
    rewrite_gemv(model, {"fc": 1})
    weights = next(i for i in model.graph.initializer if i.name.endswith("/weights"))
    weights.CopyFrom(numpy_helper.from_array(np.zeros(10, np.int8), weights.name))
    with pytest.raises(Exception, match="weights must be 512 int8 values"):
        op_session(model).run(None, {"x": random_input(rng, (1, 32), TensorProto.UINT8)})
    # a whose last dimension is not the geometry's K; output bounds on a float y
    for values, problem in (
        ([31, 0, 0], r"a must be a tensor of uint8 whose last dimension is K = 31, got \[1, 32\]"),
        ([32, 0, 0, 255, 0], "GemvU8F: geometry out of range"),
    ):
        model = qgemm(rng, 32, 16)
        rewrite_gemv(model, {"fc": 1})
        geometry = next(i for i in model.graph.initializer if i.name.endswith("/geometry"))
        geometry.CopyFrom(numpy_helper.from_array(np.array(values, np.int64), geometry.name))
        with pytest.raises(Exception, match=problem):
            op_session(model).run(None, {"x": random_input(rng, (1, 32), TensorProto.UINT8)})


def test_pack_weights_layout():
    b = np.arange(5 * 18, dtype=np.int64).reshape(5, 18).astype(np.int8)  # K 5, N 18
    packed = pack_weights(b)
    assert packed.shape == (2, 2, 16, 4)  # N16 / 16, K4 / 4, 16, 4
    assert packed[0, 0, 3, 2] == b[2, 3] and packed[1, 1, 1, 0] == b[4, 17]
    assert packed[1, 1, 1, 1] == 0 and packed[1, 0, 2, 0] == 0  # K and N padding


def test_gemm_rows_reads_the_integer_graphs_shapes():
    node = helper.make_node("Gemm", ["x", "w"], ["y"], name="fc", transB=1)
    late = helper.make_node("Gemm", ["y", "w2"], ["z"], name="fc2", transA=1)
    inits = [
        numpy_helper.from_array(np.zeros((8, 4), np.float32), "w"),
        numpy_helper.from_array(np.zeros((3, 5), np.float32), "w2"),
    ]
    graph = helper.make_graph(
        [node, late], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rows = gemm_rows(model)
    assert rows == {"fc": 1, "fc2": 8}  # fc2's A is y [1, 8] transposed: 8 rows
    assert candidates(rows) == 1
    shapes = inferred_shapes(model)  # inferred once, read by both passes (session_graph.py)
    assert gemm_rows(shapes) == rows and shapes.dims["y"] == [1, 8]
    assert gemm_rows(InferredShapes(None)) == {}  # inference failed: no GEMM qualifies


class _Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 32, 3, stride=2, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Linear(32, 96)
        self.fc2 = nn.Linear(96, 10)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv(x))).flatten(1)
        return self.fc2(torch.relu(self.fc1(x)))


def _compiled_runs(model: nn.Module, samples: list, x: torch.Tensor):
    """`model` compiled with the sim and calibrated on `samples`: (its outputs for three scales
    of `x`, the sim partitions' runtimes, the graph reports); skips where this CPU has no fused
    kernel path (nothing for the op to replace)."""
    from torch_fl import bpu
    from torch_fl.bpu import report

    torch._dynamo.reset()
    compiled = torch.compile(model, backend="bpu", options={"executor": "sim", "cache": False})
    with report.collect() as reps, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bpu.calibrate(compiled, samples)
        with torch.no_grad():
            outs = [compiled(x * scale) for scale in (1.0, 3.0, 0.2)]
    runtimes = [r for g in reps for r in g.runtimes if r.kind == "sim"]
    if runtimes[0]._exec.kernels.path == "float":
        pytest.skip("no fused kernel path on this CPU: no QGemm or QLinearConv to replace")
    return outs, runtimes, reps


def test_compiled_classifier_at_batch_1_runs_its_gemms_on_the_op(monkeypatch):
    """A classifier at batch 1 compiled with the sim: where the CPU has AVX512-VNNI its two
    Linear layers run on the Gemv op (explain() says so), and its outputs are those of the same
    compile with the rewrite off, bit for bit."""
    from torch_fl.bpu import report

    torch.manual_seed(0)
    model = _Classifier().eval()
    samples = [torch.randn(1, 3, 16, 16) for _ in range(3)]
    x = torch.randn(1, 3, 16, 16)
    outs, counts, lines = {}, {}, {}
    for rewrite in (True, False):
        if not rewrite:
            monkeypatch.setattr(session_graph_module, "gemm_rows", lambda m: {})
        outs[rewrite], runtimes, reps = _compiled_runs(model, samples, x)
        counts[rewrite] = sum(r._exec.gemv for r in runtimes)
        table = report.Report(reps).table().splitlines()
        lines[rewrite] = [ln for ln in table if ln.startswith("sim one-row GEMMs")]
    vnni = _C._gemv_kernel() == "vnni" and _C._narrow_kernel() == "vnni"
    assert counts[True] == (2 if vnni else 0) and counts[False] == 0
    assert len(lines[True]) == (1 if vnni else 0) and not lines[False]
    for a, b in zip(outs[True], outs[False], strict=True):
        assert torch.equal(a, b)


class _SqueezeExcite(nn.Module):
    """A conv, then a squeeze-excitation block (the channel means, a 1x1 conv down, ReLU, a 1x1
    conv up, hard sigmoid, the product), as MobileNetV3's."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 32, 3, stride=2, padding=1)
        self.down = nn.Conv2d(32, 8, 1)
        self.up = nn.Conv2d(8, 32, 1)
        self.head = nn.Conv2d(32, 16, 1)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        scale = nn.functional.hardsigmoid(self.up(torch.relu(self.down(x.mean((2, 3), True)))))
        return self.head(x * scale)


def test_compiled_squeeze_excitation_at_batch_1_runs_its_convs_on_the_op(monkeypatch):
    """At batch 1 the block's two 1x1 convs see one pixel: where the CPU has AVX512-VNNI they
    run on the Gemv op and the ReLU between them folds into the first one's output step; at
    batch 2 they stay ORT's. The outputs are those of the same compile with the convs left to
    ORT, bit for bit."""
    from torch_fl.bpu.conversion import gemv

    torch.manual_seed(0)
    model = _SqueezeExcite().eval()
    vnni = _C._gemv_kernel() == "vnni" and _C._narrow_kernel() == "vnni"
    for batch in (1, 2):
        samples = [torch.randn(batch, 3, 16, 16) for _ in range(3)]
        x = torch.randn(batch, 3, 16, 16)
        outs, counts = {}, {}
        for rewrite in (True, False):
            if not rewrite:  # the Gemms' rows only: the convs stay ORT's
                rows = gemv.gemm_rows
                monkeypatch.setattr(
                    session_graph_module,
                    "gemm_rows",
                    lambda m, rows=rows: {k: v for k, v in rows(m).items() if "Conv" not in k},
                )
            outs[rewrite], runtimes, _ = _compiled_runs(model, samples, x)
            counts[rewrite] = (
                sum(r._exec.gemv for r in runtimes),
                sum(r._exec.folded_clamps for r in runtimes),
            )
            monkeypatch.undo()
        gemvs = 2 if vnni and batch == 1 else 0
        assert counts[True][0] == gemvs and counts[False][0] == 0, (batch, counts)
        if gemvs:
            assert counts[True][1] == counts[False][1] + 1  # the ReLU after the first conv
        for a, b in zip(outs[True], outs[False], strict=True):
            assert torch.equal(a, b)


def _requant(acc: np.ndarray, scale: np.float32, zp: int) -> np.ndarray:
    """MLAS's requantization of int32 accumulators to uint8 (float32 multiply, clamp, nearest
    even, plus the zero point)."""
    r = np.clip(acc.astype(np.float32) * scale, np.float32(-zp), np.float32(255 - zp))
    return (np.rint(r).astype(np.int64) + zp).astype(np.uint8)


def _straddling(scale: np.float32, other: np.float32) -> np.ndarray:
    """Accumulators that requantize to other bytes under `other` than under `scale`."""
    reach = int(126 / float(scale))
    accs = np.arange(-reach, reach + 1, dtype=np.int64)
    a = np.rint(accs.astype(np.float32) * scale)
    b = np.rint(accs.astype(np.float32) * other)
    return accs[a != b]


def test_scales_are_formed_in_qgemms_order():
    """alpha * a_scale, times b_scale, over y_scale, each in float32: scales and accumulators
    (the bias of columns whose weights are (1, 0, 0, 0), so that an input of its zero point
    gives each column its bias) where the two other orders give other bytes."""
    rng = np.random.default_rng(11)
    for _ in range(500):
        alpha, a_s, b_s = (np.float32(v) for v in rng.uniform(0.1, 0.9, 3))
        y_s = np.float32(rng.uniform(20, 80))
        ours = (alpha * a_s) * b_s / y_s
        others = [alpha * (a_s * b_s) / y_s, (alpha * a_s) * (b_s / y_s)]
        hits = [_straddling(ours, o) for o in others]
        if all(len(h) for h in hits):
            break
    else:
        pytest.fail("no scales found whose orders round differently")
    biases = np.resize(np.concatenate([h[:32] for h in hits]), 64).astype(np.int32)
    model = qgemm(rng, 4, 64, float_out=False, zp_y=128, per_column=False)
    weights = np.zeros((64, 4), np.int8)
    weights[:, 0] = 1
    for name, value in (("as", a_s), ("bs", b_s), ("ys", y_s), ("b", weights), ("c", biases)):
        _initializer(model, name).CopyFrom(numpy_helper.from_array(np.asarray(value), name))
    alpha_attr = next(a for a in model.graph.node[0].attribute if a.name == "alpha")
    alpha_attr.f = float(alpha)
    x = np.array([[128, 7, 200, 3]], np.uint8)  # only the first input counts, at a's zero point
    expected = op_session(model).run(None, {"x": x})[0][0]
    accs = biases.astype(np.int64)
    assert np.array_equal(_requant(accs, ours, 128), expected)
    for other in others:  # the case tells the orders apart
        assert not np.array_equal(_requant(accs, other, 128), expected)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert rewrite_gemv(rewritten, {"fc": 1}) == 1
    np.testing.assert_array_equal(op_session(rewritten).run(None, {"x": x})[0][0], expected)

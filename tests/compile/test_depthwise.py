"""The sim's depthwise int8 conv op (conversion/depthwise.py, csrc/runtime/ort_depthwise.cpp)
against ONNX Runtime's own channels-last QLinearConv, byte for byte, in real sessions: strides,
dilations, asymmetric pads, kernel sizes inside and outside the tiled forms, zero points, u8 and
s8 weights, per-tensor and per-channel scales, with and without bias, batches, 1 and 2 threads,
the fastest form here (AVX-512; AVX2 under tests/compile/test_ops_avx2.py) and the plain
loop; then the rewrite's limits and a compiled model."""

from __future__ import annotations

import functools
import zlib

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tests.support.sim_ops import (
    assert_moved_and_unchanged,
    assert_same_bytes,
    both,
    depthwise_qlinearconv,
    op_session,
    random_input,
)
from torch_fl import _C
from torch_fl.bpu.conversion.depthwise import ALIGNED_CHANNELS, OPS, candidates, rewrite_depthwise

ort = pytest.importorskip("onnxruntime")


CASES = {
    # name: (shape NHWC, kernel, strides, dilations, pads)
    "3x3 s1 88ch": ((1, 28, 28, 88), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    "3x3 s2 72ch": ((1, 20, 20, 72), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),
    "5x5 s1 120ch": ((1, 14, 14, 120), (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),
    "5x5 s2 odd size": ((2, 15, 13, 40), (5, 5), (2, 2), (1, 1), (2, 2, 2, 2)),
    "7x7 s1 24ch": ((1, 9, 11, 24), (7, 7), (1, 1), (1, 1), (3, 3, 3, 3)),
    "3x3 3 channels": ((3, 7, 6, 3), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    "1x1": ((1, 5, 5, 17), (1, 1), (1, 1), (1, 1), (0, 0, 0, 0)),
    "3x5 asymmetric pads": ((1, 10, 12, 33), (3, 5), (1, 2), (1, 1), (0, 2, 2, 1)),
    "dilated 3x3": ((1, 12, 12, 20), (3, 3), (1, 1), (2, 2), (2, 2, 2, 2)),
    "stride 3, no tiled form": ((1, 13, 13, 18), (3, 3), (3, 3), (1, 1), (1, 1, 1, 1)),
    "9x9, no tiled form": ((1, 12, 12, 19), (9, 9), (1, 1), (1, 1), (4, 4, 4, 4)),
    "kernel as large as the padded input": ((1, 3, 4, 21), (5, 6), (1, 1), (1, 1), (1, 1, 1, 1)),
    "16 channels": ((1, 11, 11, 16), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),
}


@pytest.mark.parametrize("form", [0, 1], ids=["fastest", "portable"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_op_is_qlinearconv_byte_for_byte(case, form):
    shape, kernel, strides, dilations, pads = CASES[case]
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    model = depthwise_qlinearconv(rng, shape, kernel, strides, dilations, pads)
    rewrite = functools.partial(rewrite_depthwise, form=form, every_width=True)
    assert_same_bytes(model, shape, rewrite, "DepthwiseConvU8")


@pytest.mark.parametrize("form", [0, 1], ids=["fastest", "portable"])
@pytest.mark.parametrize(
    "quant",
    [
        dict(zp_x=0, zp_y=0),
        dict(zp_x=255, zp_y=255),
        dict(zp_x=37, zp_y=200, per_channel=False),
        dict(w_type=TensorProto.UINT8),
        dict(w_type=TensorProto.UINT8, per_channel=False, bias=False),
        dict(x_type=TensorProto.INT8, zp_x=0, zp_y=-5),
        dict(x_type=TensorProto.INT8, zp_x=-128, zp_y=127, per_channel=False),
        dict(bias_scale=2_000_000),  # large biases, still inside the exactness bound
    ],
    ids=lambda q: ",".join(f"{k}={v}" for k, v in q.items()),
)
def test_zero_points_weight_types_and_scales(quant, form):
    rng = np.random.default_rng(7)
    shape = (2, 9, 10, 24)
    model = depthwise_qlinearconv(rng, shape, (3, 3), **quant)
    x_type = quant.get("x_type", TensorProto.UINT8)
    x = random_input(rng, shape, x_type)
    expected, got, ops = both(model, x, lambda m: rewrite_depthwise(m, form=form, every_width=True))
    assert ops == [OPS[x_type]]
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
    "shape",
    [(4, 30, 30, 40), (1, 56, 56, 72)],
    ids=["batch 4", "MobileNetV3's 3x3 at stride 2"],
)
def test_split_over_two_threads_is_the_same(shape):
    """A conv of half a million multiply-adds (MobileNetV3-Small's second depthwise conv at
    batch 1) splits into pieces (kMinPieceWork, ort_depthwise.cpp): at batch 1 on 2 threads it
    ran on one while the other waited. Split, its bytes are ORT's."""
    rng = np.random.default_rng(3)
    model = depthwise_qlinearconv(rng, shape, (3, 3), strides=(2, 2))
    x = random_input(rng, shape, TensorProto.UINT8)
    expected = op_session(model, 2).run(None, {"x": x})[0]
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert rewrite_depthwise(rewritten, form=0, every_width=True) == 1
    session = op_session(rewritten, 2)
    before = _C._depthwise_pieces()
    got = session.run(None, {"x": x})[0]
    assert _C._depthwise_pieces() - before >= 2
    np.testing.assert_array_equal(got, expected)


def test_aligned_channels_and_convs_past_the_bound_stay_onnx_runtimes():
    rng = np.random.default_rng(5)
    aligned = depthwise_qlinearconv(rng, (1, 8, 8, ALIGNED_CHANNELS * 2), (3, 3))
    assert rewrite_depthwise(aligned) == 0  # ORT's kernel is the faster there
    assert rewrite_depthwise(aligned, every_width=True) == 1
    # a bias so large that an accumulator could pass 2^24: not exact in float32
    huge = depthwise_qlinearconv(rng, (1, 8, 8, 24), (3, 3))
    bias = next(i for i in huge.graph.initializer if i.name == "b")
    values = numpy_helper.to_array(bias).copy()
    values[5] = 2**24 - 1000  # channel 5's sum of |w| x 255 adds more than 1000
    bias.CopyFrom(numpy_helper.from_array(values, "b"))
    assert rewrite_depthwise(huge, every_width=True) == 0
    assert [n.op_type for n in huge.graph.node] == ["QLinearConv"]
    # a grouped conv with two channels per group is not depthwise
    model = depthwise_qlinearconv(rng, (1, 8, 8, 24), (3, 3))
    weights = next(i for i in model.graph.initializer if i.name == "w")
    weights.CopyFrom(numpy_helper.from_array(np.zeros((24, 2, 3, 3), np.int8), "w"))
    next(a for a in model.graph.node[0].attribute if a.name == "group").i = 12
    assert rewrite_depthwise(model, every_width=True) == 0


def test_bad_geometry_names_the_op_and_the_problem():
    rng = np.random.default_rng(1)
    model = depthwise_qlinearconv(rng, (1, 6, 6, 24), (3, 3))
    rewrite_depthwise(model, every_width=True)
    geometry = next(i for i in model.graph.initializer if i.name.endswith("/geometry"))
    values = numpy_helper.to_array(geometry).copy()
    values[2] = 0  # a stride of 0
    geometry.CopyFrom(numpy_helper.from_array(values, geometry.name))
    session = op_session(model)
    with pytest.raises(Exception, match="DepthwiseConvU8: geometry out of range"):
        session.run(None, {"x": random_input(rng, (1, 6, 6, 24), TensorProto.UINT8)})
    # an input smaller than the kernel: a clear error, not a read past the input
    small = depthwise_qlinearconv(rng, (1, 2, 2, 24), (5, 5), pads=(0, 0, 0, 0))
    rewrite_depthwise(small, every_width=True)
    with pytest.raises(Exception, match="smaller than the kernel"):
        op_session(small).run(None, {"x": random_input(rng, (1, 2, 2, 24), TensorProto.UINT8)})


def test_candidates_counts_unaligned_grouped_convs():
    conv = helper.make_node("Conv", ["x", "w"], ["y"], group=24)
    aligned = helper.make_node("Conv", ["y", "w2"], ["z"], group=32)
    dense = helper.make_node("Conv", ["z", "w3"], ["o"])
    graph = helper.make_graph([conv, aligned, dense], "g", [], [])
    assert candidates(helper.make_model(graph)) == 1


class _Depthwise(torch.nn.Module):
    """A depthwise block whose channel count (24) is not a multiple of 16, between dense convs."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 24, 3, padding=1), torch.nn.BatchNorm2d(24), torch.nn.ReLU(),
            torch.nn.Conv2d(24, 24, 3, stride=2, padding=1, groups=24), torch.nn.BatchNorm2d(24),
            torch.nn.Hardswish(),
            torch.nn.Conv2d(24, 40, 1), torch.nn.ReLU(),
            torch.nn.Conv2d(40, 40, 5, padding=2, groups=40), torch.nn.ReLU(),
            torch.nn.Conv2d(40, 8, 1),
        )  # fmt: skip

    def forward(self, x):
        return self.body(x)


def test_compiled_model_is_unchanged_by_the_op_and_explain_counts_it():
    torch.manual_seed(0)
    model = _Depthwise().eval()
    assert_moved_and_unchanged(
        model, "sim_depthwise", "depthwise", "depthwise", 2, "2 depthwise int8 convs",
        forms=("avx512", "avx2"),
    )  # fmt: skip


class _AlignedDepthwise(torch.nn.Module):
    """Depthwise convs over 32 channels (a multiple of `ALIGNED_CHANNELS`) and over 24."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(32, 32, 3, padding=1, groups=32), torch.nn.Hardswish(),
            torch.nn.Conv2d(32, 24, 1), torch.nn.ReLU(),
            torch.nn.Conv2d(24, 24, 5, stride=2, padding=2, groups=24), torch.nn.ReLU(),
            torch.nn.Conv2d(24, 8, 1),
        )  # fmt: skip

    def forward(self, x):
        return self.body(x)


def test_aligned_widths_stay_onnx_runtimes_on_every_form():
    """On either vector form of the op only the 24-channel conv moves; the 32-channel one stays
    ORT's. On AVX2 too: moving aligned widths there (tried) made whole sessions slower
    (MobileNetV2 1.1x: docs/compile.md)."""
    torch.manual_seed(0)
    assert_moved_and_unchanged(
        _AlignedDepthwise().eval(), "sim_depthwise", "depthwise", "depthwise", 1,
        "1 depthwise int8 conv", forms=("avx512", "avx2"),
    )  # fmt: skip


def _ties(xs: np.float32, ys: np.float32, count: int) -> list[tuple[np.float32, int]]:
    """(w_scale, accumulator) pairs where ORT's scale `xs * w / ys` and the other order
    `xs * (w / ys)`, both in float32, round the accumulator to different bytes (within
    +-100 of the zero point)."""
    rng = np.random.default_rng(11)
    acc = np.arange(-2000, 2001, dtype=np.float32)
    found: list[tuple[np.float32, int]] = []
    while len(found) < count:
        ws = np.float32(rng.uniform(0.001, 0.1))
        ours, other = (xs * ws) / ys, xs * (ws / ys)
        differ = np.nonzero(
            (np.rint(acc * ours) != np.rint(acc * other)) & (np.abs(acc * ours) < 100)
        )[0]
        if len(differ):
            found.append((ws, int(acc[differ[0]])))
    return found


@pytest.mark.parametrize("form", [0, 1], ids=["fastest", "portable"])
def test_requantization_scale_is_formed_in_onnx_runtimes_order(form):
    """Accumulators whose byte depends on the order the scale's product is formed in: one
    channel each, weight 1, each accumulator set through the bias (x at its zero point + 1)."""
    xs, ys = np.float32(0.0173), np.float32(0.0291)
    ties = _ties(xs, ys, 8)
    channels = len(ties)
    model = depthwise_qlinearconv(
        np.random.default_rng(0), (1, 1, 1, channels), (1, 1), pads=(0, 0, 0, 0)
    )
    values = {
        "xs": np.array(xs, np.float32),
        "w": np.ones((channels, 1, 1, 1), np.int8),
        "ws": np.array([ws for ws, _ in ties], np.float32),
        "ys": np.array(ys, np.float32),
        "yz": np.array(128, np.uint8),
        "b": np.array([acc - 1 for _, acc in ties], np.int32),
    }
    for init in model.graph.initializer:
        if init.name in values:
            init.CopyFrom(numpy_helper.from_array(values[init.name], init.name))
    x = np.full((1, 1, 1, channels), 129, np.uint8)  # q_x - zp_x = 1
    expected, got, _ = both(model, x, lambda m: rewrite_depthwise(m, form=form, every_width=True))
    np.testing.assert_array_equal(got, expected)


def _reference(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """The op's definition in numpy: the exact integer accumulator of the rewritten graph's
    inputs, times its float32 scale, clamped, rounded to nearest even, plus the zero point."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    node = model.graph.node[0]
    weights, bias, scale, geometry = (inits[name] for name in node.input[1:])
    kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, zp_x, zp_y, _ = (int(v) for v in geometry)
    n, h, w, c = x.shape
    padded = np.zeros((n, h + pt + pb, w + pl + pr, c), np.int64)
    padded[:, pt : pt + h, pl : pl + w] = x.astype(np.int64) - zp_x
    oh = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (w + pl + pr - (kw - 1) * dw - 1) // sw + 1
    acc = np.broadcast_to(bias.astype(np.int64), (n, oh, ow, c)).copy()
    for i in range(kh):
        for j in range(kw):
            window = padded[:, i * dh : i * dh + (oh - 1) * sh + 1 : sh,
                            j * dw : j * dw + (ow - 1) * sw + 1 : sw]  # fmt: skip
            acc += window * weights[i * kw + j].astype(np.int64)
    lo, hi = (0, 255) if x.dtype == np.uint8 else (-128, 127)
    scaled = acc.astype(np.float32) * scale
    scaled = np.minimum(np.maximum(scaled, np.float32(lo - zp_y)), np.float32(hi - zp_y))
    return (np.rint(scaled).astype(np.int64) + zp_y).astype(x.dtype)


@pytest.mark.board
@pytest.mark.parametrize(
    "case", ["3x3 s2 72ch", "5x5 s2 odd size", "dilated 3x3", "9x9, no tiled form"]
)
def test_on_this_cpu_the_op_loads_and_computes_its_definition(case):
    """The board's check (aarch64, its own ONNX Runtime build, the plain loop): the op loads
    through the custom-op interface and both forms give the numpy definition, at 1 and 2
    threads. (Where ORT's own QLinearConv requantizes otherwise, the sim keeps ORT's kernel:
    the op runs only where it has a vector form.)"""
    shape, kernel, strides, dilations, pads = CASES[case]
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    model = depthwise_qlinearconv(rng, shape, kernel, strides, dilations, pads)
    x = random_input(rng, shape, TensorProto.UINT8)
    for form in (0, 1):
        rewritten = onnx.ModelProto()
        rewritten.CopyFrom(model)
        assert rewrite_depthwise(rewritten, form=form, every_width=True) == 1
        want = _reference(rewritten, x)
        for threads in (1, 2):
            got = op_session(rewritten, threads).run(None, {"x": x})[0]
            np.testing.assert_array_equal(got, want)
    assert _C._depthwise_kernel() in ("avx512", "avx2", "portable")

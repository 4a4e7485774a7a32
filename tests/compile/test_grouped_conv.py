"""The sim's grouped int8 conv op (conversion/grouped_conv.py, csrc/runtime/ort_depthwise.cpp)
against ONNX Runtime's own channels-last QLinearConv, byte for byte, in real sessions: group
widths 2 to 8 (the permute), groups whose outputs fill blocks of 16 (the broadcast), widths the
AVX-512 form does not lay out (the plain loop), strides, dilations, asymmetric pads, kernel sizes
inside and outside the tiled forms, channel tails, zero points, u8 and s8, 1 and 2 threads, both
forms; then which convs the rewrite takes and a compiled model."""

from __future__ import annotations

import functools
import zlib

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tests.support.sim_ops import (
    NP,
    assert_moved_and_unchanged,
    assert_same_bytes,
    both,
    conv_graph,
    op_session,
    random_input,
)
from torch_fl.bpu.conversion.grouped_conv import (
    DOT_OPS,
    MAX_DOT_WIDTH,
    MAX_GROUP_WIDTH,
    OPS,
    candidates,
    dot_fits,
    fits,
    rewrite_grouped,
)

ort = pytest.importorskip("onnxruntime")


def _grouped(
    rng: np.random.Generator,
    shape: tuple[int, int, int, int],
    outputs: int,
    width: int,
    kernel: tuple[int, int] = (3, 3),
    strides=(1, 1),
    dilations=(1, 1),
    pads=(1, 1, 1, 1),
    x_type=TensorProto.UINT8,
    zp_x=128,
    zp_y=100,
    w_type=TensorProto.INT8,
    per_channel=True,
    bias=True,
) -> onnx.ModelProto:
    """One channels-last grouped QLinearConv (com.microsoft, as ORT's optimizer writes it) of
    groups `width` input channels wide, over an NHWC input of `shape`, to `outputs` channels,
    with random weights, scales and bias."""
    n, h, w, c = shape
    kh, kw = kernel
    if w_type == TensorProto.INT8:
        weights, w_zp = rng.integers(-127, 128, (outputs, width, kh, kw)).astype(np.int8), 0
    else:
        weights, w_zp = rng.integers(0, 256, (outputs, width, kh, kw)).astype(np.uint8), 128
    w_np = NP[w_type]
    # the scales keep the outputs spread over the byte range (a sum over width x taps inputs)
    spread = 1.0 / np.sqrt(width * kh * kw)
    w_scale = (rng.uniform(0.002, 0.01, outputs if per_channel else 1) * spread).astype(np.float32)
    inits = [
        numpy_helper.from_array(np.array(rng.uniform(0.01, 0.05), np.float32), "xs"),
        numpy_helper.from_array(np.array(zp_x, NP[x_type]), "xz"),
        numpy_helper.from_array(weights, "w"),
        numpy_helper.from_array(w_scale if per_channel else w_scale.reshape(()), "ws"),
        numpy_helper.from_array(
            np.full(outputs, w_zp, w_np) if per_channel else np.array(w_zp, w_np), "wz"
        ),
        numpy_helper.from_array(np.array(rng.uniform(0.005, 0.02), np.float32), "ys"),
        numpy_helper.from_array(np.array(zp_y, NP[x_type]), "yz"),
    ]
    inputs = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"]
    if bias:
        inits.append(
            numpy_helper.from_array(rng.integers(-3000, 3001, outputs).astype(np.int32), "b")
        )
        inputs.append("b")
    node = helper.make_node(
        "QLinearConv", inputs, ["y"], domain="com.microsoft", name="grouped",
        group=c // width, kernel_shape=list(kernel), strides=list(strides),
        dilations=list(dilations), pads=list(pads), channels_last=1,
    )  # fmt: skip
    return conv_graph([node], inits, shape, x_type)


CASES = {
    # name: (shape NHWC, outputs, group width, kernel, strides, dilations, pads)
    "RegNet 3x3 s2, 8 wide": ((1, 28, 28, 48), 48, 8, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),
    "3x3 s1, 8 wide, a tail": ((1, 14, 14, 40), 40, 8, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    "ResNeXt 3x3, 4 wide": ((1, 12, 12, 64), 64, 4, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    "2 wide, odd size": ((2, 9, 11, 20), 20, 2, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),
    "5x5, 8 wide": ((1, 11, 10, 24), 24, 8, (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),
    "1x1, 4 wide": ((1, 6, 7, 36), 36, 4, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0)),
    "3x5 asymmetric pads": ((1, 10, 12, 32), 32, 8, (3, 5), (1, 2), (1, 1), (0, 2, 2, 1)),
    "dilated, no tiled form": ((1, 12, 12, 16), 16, 4, (3, 3), (1, 1), (2, 2), (2, 2, 2, 2)),
    "stride 3, no tiled form": ((1, 13, 13, 24), 24, 8, (3, 3), (3, 3), (1, 1), (1, 1, 1, 1)),
    "outputs fill blocks": ((1, 9, 9, 8), 32, 4, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    "depthwise, 16 outputs a group": ((1, 9, 9, 4), 64, 1, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),
    "3 wide: the plain loop": ((1, 8, 9, 24), 24, 3, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    "8 wide, 4 outputs a group": ((1, 8, 8, 32), 16, 8, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    "32 wide: a broadcast": ((1, 7, 7, 64), 64, 32, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
}


KINDS = {"float": dict(dot=False, floats=True), "dot": dict(dot=True, floats=False)}
"""The two ops: GroupedConv (float multiply-adds) and GroupedDotConv (VNNI byte dot products,
groups a multiple of 4 wide)."""


def _kind_cases() -> list[tuple[str, str]]:
    return [(kind, case) for kind in KINDS for case in sorted(CASES)
            if kind == "float" or CASES[case][2] % 4 == 0]  # fmt: skip


@pytest.mark.parametrize("form", [0, 1], ids=["fastest", "portable"])
@pytest.mark.parametrize("kind,case", _kind_cases())
def test_op_is_qlinearconv_byte_for_byte(kind, case, form):
    shape, outputs, width, kernel, strides, dilations, pads = CASES[case]
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    model = _grouped(rng, shape, outputs, width, kernel, strides, dilations, pads)
    rewrite = functools.partial(rewrite_grouped, form=form, every_shape=True, **KINDS[kind])
    assert_same_bytes(
        model, shape, rewrite, (OPS if kind == "float" else DOT_OPS)[TensorProto.UINT8]
    )


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
    ],
    ids=lambda q: ",".join(f"{k}={v}" for k, v in q.items()),
)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_zero_points_weight_types_and_scales(kind, quant, form):
    rng = np.random.default_rng(7)
    shape = (2, 9, 10, 24)
    model = _grouped(rng, shape, 24, 8, **quant)
    x_type = quant.get("x_type", TensorProto.UINT8)
    x = random_input(rng, shape, x_type)
    rewrite = functools.partial(rewrite_grouped, form=form, **KINDS[kind])
    expected, got, ops = both(model, x, rewrite)
    assert ops == [(OPS if kind == "float" else DOT_OPS)[x_type]]
    np.testing.assert_array_equal(got, expected)
    assert len(np.unique(expected)) > 20


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_split_over_two_threads_is_the_same(kind):
    rng = np.random.default_rng(3)
    shape = (2, 30, 30, 48)  # enough work for several pieces (kMinPieceWork)
    model = _grouped(rng, shape, 48, 8, strides=(2, 2))
    x = random_input(rng, shape, TensorProto.UINT8)
    expected, got, _ = both(model, x, lambda m: rewrite_grouped(m, **KINDS[kind]), threads=2)
    np.testing.assert_array_equal(got, expected)


def test_the_dot_op_takes_what_its_words_fit_and_the_float_op_the_rest():
    """With both ops on (a VNNI CPU): groups 4 or 8 wide, or whose outputs fill blocks of 16, up
    to MAX_DOT_WIDTH, go to the dot op; 2 wide to the float op; u8 weights whose zero point
    leaves them past int8 to the float op where it takes them; wider groups stay ORT's."""
    assert [dot_fits(w, w) for w in (4, 8)] == [True, True]
    assert dot_fits(16, 16) and dot_fits(MAX_DOT_WIDTH, MAX_DOT_WIDTH) and dot_fits(4, 16)
    assert not dot_fits(2, 2) and not dot_fits(12, 12) and not dot_fits(2 * MAX_DOT_WIDTH, 64)
    rng = np.random.default_rng(9)
    for width, op in ((8, DOT_OPS), (16, DOT_OPS), (2, OPS), (64, None)):
        model = _grouped(rng, (1, 6, 6, 128), 128, width)
        taken = rewrite_grouped(model, dot=True)
        assert taken == (op is not None), width
        if op is not None:
            assert [n.op_type for n in model.graph.node] == [op[TensorProto.UINT8]], width
    # u8 weights with zero point 0: 0..255 less 0 does not fit int8
    wide = _grouped(rng, (1, 6, 6, 32), 32, 8, w_type=TensorProto.UINT8)
    point = next(i for i in wide.graph.initializer if i.name == "wz")
    point.CopyFrom(numpy_helper.from_array(np.zeros(32, np.uint8), "wz"))
    assert rewrite_grouped(wide, dot=True) == 1
    assert [n.op_type for n in wide.graph.node] == ["GroupedConvU8"]


def test_which_group_shapes_the_rewrite_takes():
    """Narrow groups as wide as their outputs, or whose outputs fill blocks of 16, up to
    MAX_GROUP_WIDTH; not depthwise convs (conversion/depthwise.py's), not wider groups (ORT's
    GEMM is the faster there), not convs past the exactness bound."""
    assert [fits(w, w) for w in (2, 4, 8)] == [True] * 3
    assert not fits(3, 3) and not fits(1, 1) and not fits(MAX_GROUP_WIDTH * 2, 16)
    assert fits(4, 16) and not fits(4, 8)
    rng = np.random.default_rng(5)
    for width, taken in ((8, 1), (16, 0), (3, 0)):
        model = _grouped(rng, (1, 8, 8, 48), 48, width)
        assert rewrite_grouped(model) == taken, width
    depthwise = _grouped(rng, (1, 8, 8, 24), 24, 1)
    assert rewrite_grouped(depthwise, every_shape=True) == 0
    # a bias so large that an accumulator could pass 2^24: not exact in float32
    huge = _grouped(rng, (1, 8, 8, 24), 24, 8)
    bias = next(i for i in huge.graph.initializer if i.name == "b")
    values = numpy_helper.to_array(bias).copy()
    values[5] = 2**24 - 1000
    bias.CopyFrom(numpy_helper.from_array(values, "b"))
    assert rewrite_grouped(huge, every_shape=True) == 0
    assert [n.op_type for n in huge.graph.node] == ["QLinearConv"]


def test_bad_geometry_names_the_op_and_the_problem():
    rng = np.random.default_rng(1)
    shape = (1, 6, 6, 24)
    model = _grouped(rng, shape, 24, 8)
    rewrite_grouped(model)
    geometry = next(i for i in model.graph.initializer if i.name.endswith("/geometry"))
    x = random_input(rng, shape, TensorProto.UINT8)
    for index, value, message in (
        (2, 0, "GroupedConvU8: geometry out of range"),  # a stride of 0
        (12, 5, "24 input channels in groups of 5 do not divide"),
        (12, 0, "in groups of 0"),
    ):
        broken = onnx.ModelProto()
        broken.CopyFrom(model)
        values = numpy_helper.to_array(geometry).copy()
        values[index] = value
        target = next(i for i in broken.graph.initializer if i.name == geometry.name)
        target.CopyFrom(numpy_helper.from_array(values, geometry.name))
        with pytest.raises(Exception, match=message):
            op_session(broken).run(None, {"x": x})
    # the dot op: groups a multiple of 4 wide
    dot = _grouped(rng, shape, 24, 8)
    assert rewrite_grouped(dot, dot=True, floats=False) == 1
    geometry = next(i for i in dot.graph.initializer if i.name.endswith("/geometry"))
    values = numpy_helper.to_array(geometry).copy()
    values[12] = 6
    geometry.CopyFrom(numpy_helper.from_array(values, geometry.name))
    with pytest.raises(Exception, match=r"GroupedDotConvU8: 24 input channels in groups of 6"):
        op_session(dot).run(None, {"x": x})


def test_candidates_reads_the_group_widths_where_the_weights_say():
    """Before ORT's optimizer a conv's weights are an initializer or a DequantizeLinear of one:
    8-wide groups count, 64-wide and depthwise ones do not, unknown weights count."""
    inits = [
        numpy_helper.from_array(np.zeros((48, 8, 3, 3), np.int8), "w8"),
        numpy_helper.from_array(np.zeros((128, 64, 3, 3), np.int8), "w64"),
        numpy_helper.from_array(np.zeros((24, 1, 3, 3), np.float32), "wd"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["w8", "s"], ["w8f"]),
        helper.make_node("Conv", ["x", "w8f"], ["a"], group=6),
        helper.make_node("Conv", ["a", "w64"], ["b"], group=2),
        helper.make_node("Conv", ["b", "wd"], ["c"], group=24),
        helper.make_node("Conv", ["c", "unknown"], ["d"], group=4),
        helper.make_node("Conv", ["d", "w8"], ["e"]),
    ]
    graph = helper.make_graph(nodes, "g", [], [], inits)
    assert candidates(helper.make_model(graph)) == 2


class _Grouped(torch.nn.Module):
    """RegNet's block shape: a grouped 3x3 of 8-channel groups between 1x1 convs."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
            torch.nn.Conv2d(32, 48, 1), torch.nn.BatchNorm2d(48), torch.nn.ReLU(),
            torch.nn.Conv2d(48, 48, 3, stride=2, padding=1, groups=6), torch.nn.BatchNorm2d(48),
            torch.nn.ReLU(),
            torch.nn.Conv2d(48, 64, 1), torch.nn.ReLU(),
            torch.nn.Conv2d(64, 64, 3, padding=1, groups=16), torch.nn.ReLU(),
            torch.nn.Conv2d(64, 8, 1),
        )  # fmt: skip

    def forward(self, x):
        return self.body(x)


def test_compiled_model_is_unchanged_by_the_op_and_explain_counts_it():
    torch.manual_seed(0)
    model = _Grouped().eval()
    assert_moved_and_unchanged(
        model, "sim_depthwise", "grouped", "grouped", 2, "2 grouped int8 convs of narrow groups"
    )

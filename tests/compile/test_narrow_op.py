"""The sim's narrow int8 conv op (conversion/narrow_op.py, csrc/runtime/ort_narrow.cpp) against
ONNX Runtime's own channels-last QLinearConv, byte for byte, in real sessions: 1 to 4 input
channels, 1 to 64 outputs (whole and partial blocks of 16), strides, dilations, asymmetric pads,
kernels, zero points, u8 and s8 weights, per-tensor and per-channel scales, biases up to int32's
range, NHWC inputs and NCHW ones read through the transpose it absorbs, batches, 1 and 2 threads,
the fastest form here (VNNI; AVX2 under tests/compile/test_ops_avx2.py) and the plain loop; then
the rewrite's limits, bad input and a compiled model."""

from __future__ import annotations

import zlib

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tests.support.sim_ops import (
    assert_same_bytes,
    both,
    compiled_both_ways,
    exact_reference,
    narrow_qlinearconv,
    op_session,
    random_input,
)
from torch_fl import _C
from torch_fl.bpu.conversion.narrow_op import (
    MAX_INPUTS,
    MAX_OUTPUTS,
    MAX_OUTPUTS_BY_FORM,
    OPS,
    candidates,
    rewrite_narrow,
)

ort = pytest.importorskip("onnxruntime")


CASES = {
    # name: (shape, NCHW?, outputs, kernel, strides, dilations, pads)
    "stem 3x3 s2 3->16": ((1, 3, 40, 38), True, 16, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),
    "stem 3x3 s2 3->16 NHWC": ((1, 40, 38, 3), False, 16, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),
    "3->32, 35 wide (a 16-pixel SIMD tail)": (
        (2, 3, 19, 35), True, 32, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),
    "7x7 s2 3->64": ((1, 3, 23, 21), True, 64, (7, 7), (2, 2), (1, 1), (3, 3, 3, 3)),
    "3->40 (a partial block)": ((1, 3, 12, 17), True, 40, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    "1 channel -> 5": ((2, 1, 9, 33), True, 5, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    "2 channels NHWC -> 24": ((1, 11, 10, 2), False, 24, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    "2 channels NCHW -> 16, 40 wide": (
        (1, 2, 7, 40), True, 16, (3, 3), (2, 1), (1, 1), (1, 0, 1, 2)),
    "4 channels -> 48, 5x3 asymmetric pads": (
        (1, 4, 13, 16), True, 48, (5, 3), (1, 2), (1, 1), (0, 2, 2, 1)),
    "dilated, stride 3": ((1, 3, 17, 19), True, 16, (3, 3), (3, 3), (2, 2), (2, 1, 2, 1)),
    "rows dilated only": ((1, 3, 15, 17), True, 16, (3, 3), (1, 1), (2, 1), (2, 1, 2, 1)),
    "1x1": ((1, 3, 5, 7), True, 8, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0)),
    "kernel as large as the padded input": (
        (1, 3, 4, 5), True, 16, (6, 7), (1, 1), (1, 1), (1, 1, 1, 1)),
}  # fmt: skip


@pytest.mark.parametrize("form", [0, 1], ids=["fastest", "portable"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_op_is_qlinearconv_byte_for_byte(case, form):
    shape, nchw, outputs, kernel, strides, dilations, pads = CASES[case]
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    model = narrow_qlinearconv(rng, shape, outputs, kernel, strides, dilations, pads, nchw=nchw)
    # one node: the transpose, where there was one, is gone
    assert_same_bytes(model, shape, lambda m: rewrite_narrow(m, form=form), "NarrowConvU8")


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
        dict(x_type=TensorProto.INT8, zp_x=100, zp_y=0, nchw=True),
        dict(bias_scale=2_000_000_000),  # biases near int32's ends
    ],
    ids=lambda q: ",".join(f"{k}={v}" for k, v in q.items()),
)
def test_zero_points_weight_types_and_scales(quant, form):
    rng = np.random.default_rng(7)
    nchw = quant.get("nchw", False)
    shape = (2, 3, 9, 21) if nchw else (2, 9, 21, 3)
    model = narrow_qlinearconv(rng, shape, 16, (3, 3), **quant)
    x_type = quant.get("x_type", TensorProto.UINT8)
    x = random_input(rng, shape, x_type)
    expected, got, ops = both(model, x, lambda m: rewrite_narrow(m, form=form))
    assert ops == [OPS[x_type]]
    np.testing.assert_array_equal(got, expected)


# case -> whether the AVX2 form takes it over packed rows (no column dilation, at most 32
# outputs); the others run over 4-byte words
PACKED_ON_AVX2 = {
    "stem 3x3 s2 3->16": True,
    "stem 3x3 s2 3->16 NHWC": True,
    "3->32, 35 wide (a 16-pixel SIMD tail)": True,
    "1 channel -> 5": True,
    "2 channels NHWC -> 24": True,
    "1x1": True,
    "7x7 s2 3->64": False,
    "3->40 (a partial block)": False,
    "4 channels -> 48, 5x3 asymmetric pads": False,
    "dilated, stride 3": False,
    "rows dilated only": True,
}


@pytest.mark.parametrize("case", sorted(PACKED_ON_AVX2))
def test_the_avx2_form_packs_the_rows_it_can(case):
    """On AVX2 without VNNI a conv with no column dilation and at most 32 outputs runs over
    packed rows, every output row of it; the others over 4-byte words. Both give QLinearConv's
    bytes (test_op_is_qlinearconv_byte_for_byte runs each case in the fastest form)."""
    if _C._narrow_kernel() != "avx2":
        pytest.skip(f"the narrow op's form here is {_C._narrow_kernel()}, not avx2")
    shape, nchw, outputs, kernel, strides, dilations, pads = CASES[case]
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    model = narrow_qlinearconv(rng, shape, outputs, kernel, strides, dilations, pads, nchw=nchw)
    x = random_input(rng, shape, TensorProto.UINT8)
    before = _C._narrow_packed_rows()
    expected, got, _ = both(model, x, lambda m: rewrite_narrow(m, form=0))
    np.testing.assert_array_equal(got, expected)
    packed = _C._narrow_packed_rows() - before
    rows = got.shape[0] * got.shape[1]  # N * OH (the output is channels-last)
    assert packed == (rows if PACKED_ON_AVX2[case] else 0)


def test_split_over_two_threads_is_the_same():
    rng = np.random.default_rng(3)
    shape = (3, 3, 64, 64)  # enough work for several pieces (kMinPieceWork)
    model = narrow_qlinearconv(rng, shape, 24, (3, 3), strides=(2, 2), nchw=True)
    x = random_input(rng, shape, TensorProto.UINT8)
    expected, got, _ = both(model, x, lambda m: rewrite_narrow(m, form=0), threads=2)
    np.testing.assert_array_equal(got, expected)


def test_wide_grouped_and_out_of_range_convs_stay_onnx_runtimes():
    rng = np.random.default_rng(5)
    wide = narrow_qlinearconv(rng, (1, 6, 6, MAX_INPUTS + 1), 16, (3, 3))
    assert rewrite_narrow(wide) == 0
    many = narrow_qlinearconv(rng, (1, 6, 6, 3), MAX_OUTPUTS + 16, (3, 3))
    assert rewrite_narrow(many) == 0
    # u8 weights whose zero point leaves w - zp outside int8 (vpdpbusd's signed operand)
    far = narrow_qlinearconv(rng, (1, 6, 6, 3), 16, (3, 3), w_type=TensorProto.UINT8)
    zero = next(i for i in far.graph.initializer if i.name == "wz")
    zero.CopyFrom(numpy_helper.from_array(np.zeros(16, np.uint8), "wz"))
    assert rewrite_narrow(far) == 0
    grouped = narrow_qlinearconv(rng, (1, 6, 6, 4), 4, (3, 3))
    weights = next(i for i in grouped.graph.initializer if i.name == "w")
    weights.CopyFrom(numpy_helper.from_array(np.ones((4, 2, 3, 3), np.int8), "w"))
    grouped.graph.node[0].attribute.append(helper.make_attribute("group", 2))
    assert rewrite_narrow(grouped) == 0


def test_a_transpose_read_elsewhere_stays():
    rng = np.random.default_rng(9)
    model = narrow_qlinearconv(rng, (1, 3, 10, 10), 16, (3, 3), nchw=True)
    model.graph.output.append(helper.make_tensor_value_info("x_nhwc", TensorProto.UINT8, None))
    x = random_input(rng, (1, 3, 10, 10), TensorProto.UINT8)
    expected = op_session(exact_reference(model)).run(None, {"x": x})
    assert rewrite_narrow(model) == 1
    assert [n.op_type for n in model.graph.node] == ["Transpose", "NarrowConvU8"]
    got = op_session(model).run(None, {"x": x})
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_array_equal(a, b)


def _rewritten(rng, shape=(1, 3, 6, 6), outputs=16) -> onnx.ModelProto:
    model = narrow_qlinearconv(rng, shape, outputs, (3, 3), nchw=True)
    assert rewrite_narrow(model) == 1
    return model


def _set(model: onnx.ModelProto, suffix: str, values: np.ndarray) -> None:
    init = next(i for i in model.graph.initializer if i.name.endswith(suffix))
    init.CopyFrom(numpy_helper.from_array(values, init.name))


def _array(model: onnx.ModelProto, suffix: str) -> np.ndarray:
    init = next(i for i in model.graph.initializer if i.name.endswith(suffix))
    return numpy_helper.to_array(init).copy()


def test_bad_inputs_name_the_op_and_the_problem():
    rng = np.random.default_rng(1)
    x = random_input(rng, (1, 3, 6, 6), TensorProto.UINT8)
    model = _rewritten(rng)
    geometry = _array(model, "/geometry")
    geometry[2] = 0  # a stride of 0
    _set(model, "/geometry", geometry)
    with pytest.raises(Exception, match="NarrowConvU8: geometry out of range"):
        op_session(model).run(None, {"x": x})
    model = _rewritten(rng)
    weights = _array(model, "/weights")
    weights[0, 0, 3] = 1  # a weight on the padding channel (the input has 3)
    _set(model, "/weights", weights)
    with pytest.raises(Exception, match="padding input channels must be zero"):
        op_session(model).run(None, {"x": x})
    model = _rewritten(rng)
    _set(model, "/bias", np.zeros(3, np.int32))
    with pytest.raises(Exception, match="bias must be 16 int32 values"):
        op_session(model).run(None, {"x": x})
    # more channels than a word holds, and an input smaller than the kernel
    model = _rewritten(rng, (1, 3, 6, 6))
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 5
    with pytest.raises(Exception, match="1 to 4 channels"):
        op_session(model).run(None, {"x": random_input(rng, (1, 5, 6, 6), TensorProto.UINT8)})
    model = _rewritten(rng)
    geometry = _array(model, "/geometry")
    geometry[4:8] = 0  # no padding: a 3x3 kernel over a 2x2 input
    _set(model, "/geometry", geometry)
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 2
    model.graph.input[0].type.tensor_type.shape.dim[3].dim_value = 2
    with pytest.raises(Exception, match="smaller than the kernel"):
        op_session(model).run(None, {"x": random_input(rng, (1, 3, 2, 2), TensorProto.UINT8)})


def test_candidates_counts_convs_over_few_channels():
    inits = [
        numpy_helper.from_array(np.zeros((16, 3, 3, 3), np.int8), "w"),
        numpy_helper.from_array(np.zeros((16, 16, 1, 1), np.float32), "w2"),
        numpy_helper.from_array(np.zeros((16, 1, 3, 3), np.float32), "w3"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["w", "s"], ["w_dq"]),
        helper.make_node("Conv", ["x", "w_dq"], ["y"]),
        helper.make_node("Conv", ["y", "w2"], ["z"]),
        helper.make_node("Conv", ["z", "w3"], ["o"], group=16),
    ]
    graph = helper.make_graph(nodes, "g", [], [], inits)
    assert candidates(helper.make_model(graph)) == 1


def test_a_form_bound_on_outputs_leaves_wider_convs_onnx_runtimes():
    """`max_outputs` (the AVX2 form's MAX_OUTPUTS_BY_FORM bound) leaves a 3 -> 64 stem to ORT's
    QLinearConv and still takes a 3 -> 32 one."""
    rng = np.random.default_rng(4)
    wide = narrow_qlinearconv(rng, (1, 3, 12, 12), 64, (7, 7), pads=(3, 3, 3, 3), nchw=True)
    narrow = narrow_qlinearconv(rng, (1, 3, 12, 12), MAX_OUTPUTS_BY_FORM["avx2"], (3, 3), nchw=True)
    assert rewrite_narrow(wide, max_outputs=MAX_OUTPUTS_BY_FORM["avx2"]) == 0
    assert "QLinearConv" in [n.op_type for n in wide.graph.node]
    assert rewrite_narrow(narrow, max_outputs=MAX_OUTPUTS_BY_FORM["avx2"]) == 1
    assert rewrite_narrow(wide, max_outputs=MAX_OUTPUTS_BY_FORM["vnni"]) == 1


class _Stem(torch.nn.Module):
    """An image stem (3 -> 16 channels, stride 2) and a wider one (3 -> 24) on the same input."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16),
            torch.nn.Hardswish(),
            torch.nn.Conv2d(16, 16, 3, padding=1, groups=16), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 24, 1),
        )  # fmt: skip
        self.side = torch.nn.Conv2d(3, 24, 5, stride=2, padding=2)

    def forward(self, x):
        return self.stem(x) + self.side(x)


def test_compiled_model_is_unchanged_by_the_op_and_explain_counts_it():
    torch.manual_seed(0)
    model = _Stem().eval()
    x = torch.randn(2, 3, 30, 34)
    samples = [torch.randn(2, 3, 30, 34) for _ in range(3)]
    outs, runtimes, lines = compiled_both_ways(model, x, samples, "sim_narrow_op", "narrow")
    sims = runtimes[True]
    fast = _C._narrow_kernel() != "portable"
    assert sum(r._exec.narrow_ops for r in sims) == (2 if fast else 0)
    assert sum(r._exec.narrow_ops for r in runtimes[False]) == 0
    if fast:
        assert any(
            "2 narrow int8 convs on the extension's VNNI / AVX2 kernel" in s for s in lines[True]
        )
        # where the op runs, the float form of narrow_convs.py does not
        assert sum(r._exec.narrow_convs for r in sims) == 0
    else:
        assert not any("narrow int8 conv" in s for s in lines[True])
    for a, b in zip(outs[True], outs[False], strict=True):
        assert torch.equal(a, b)


def _reference(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """The op's definition in numpy: QLinearConv's integer accumulator from the rewritten
    graph's inputs (x less its zero point, padding at zero), times the float32 scale, clamped,
    rounded to nearest even, plus the zero point."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    node = next(n for n in model.graph.node if n.op_type.startswith("NarrowConv"))
    weights, bias, scale, geometry = (inits[name] for name in node.input[1:])
    kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, zp_x, zp_y, co, layout, _ = (int(v) for v in geometry)
    if layout == 1:
        x = x.transpose(0, 2, 3, 1)
    n, h, w, c = x.shape
    padded = np.zeros((n, h + pt + pb, w + pl + pr, c), np.int64)
    padded[:, pt : pt + h, pl : pl + w] = x.astype(np.int64) - zp_x
    oh = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (w + pl + pr - (kw - 1) * dw - 1) // sw + 1
    acc = np.broadcast_to(bias.astype(np.int64), (n, oh, ow, co)).copy()
    for i in range(kh):
        for j in range(kw):
            window = padded[:, i * dh : i * dh + (oh - 1) * sh + 1 : sh,
                            j * dw : j * dw + (ow - 1) * sw + 1 : sw]  # fmt: skip
            taps = weights[i * kw + j, :co, :c].astype(np.int64)  # [CO, C]
            acc += window @ taps.T
    acc = (acc + 2**31) % 2**32 - 2**31  # int32, wrapping
    lo, hi = (0, 255) if x.dtype == np.uint8 else (-128, 127)
    r = np.clip(acc.astype(np.float32) * scale, np.float32(lo - zp_y), np.float32(hi - zp_y))
    return (np.rint(r).astype(np.int64) + zp_y).astype(x.dtype)


@pytest.mark.board
@pytest.mark.parametrize("case", ["stem 3x3 s2 3->16", "2 channels NHWC -> 24", "1x1"])
def test_op_matches_its_definition_on_this_cpu(case):
    """On the board (aarch64, its own ONNX Runtime, the plain loop) and any host: the op against
    its numpy definition, x of both types."""
    shape, nchw, outputs, kernel, strides, dilations, pads = CASES[case]
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    for x_type, zp_x, zp_y in ((TensorProto.UINT8, 128, 100), (TensorProto.INT8, -3, 7)):
        model = narrow_qlinearconv(
            rng, shape, outputs, kernel, strides, dilations, pads, x_type, zp_x, zp_y, nchw=nchw
        )
        assert rewrite_narrow(model, form=1) == 1
        x = random_input(rng, shape, x_type)
        got = op_session(model).run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, _reference(model, x))

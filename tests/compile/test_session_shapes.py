"""The shapes the sim declares for ONNX Runtime past the extension's ops
(conversion/session_shapes.py), and what they are for: byte lookups that run over their input's
buffer (csrc/runtime/ort_kernel.h, `in_place_op`), in real sessions, with the same bytes."""

from __future__ import annotations

import zlib

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tests.compile.test_narrow_op import CASES
from tests.support.sim_ops import narrow_qlinearconv, op_session, random_input
from torch_fl import _C
from torch_fl.bpu.conversion.lookups import DOMAIN
from torch_fl.bpu.conversion.narrow_op import rewrite_narrow
from torch_fl.bpu.conversion.session_shapes import declare_shapes

pytest.importorskip("onnxruntime")

RELU = np.maximum(np.arange(256), 100).astype(np.uint8)  # a clamp at the conv's zero point 100
STEP = 0.05  # the dequantize after the clamp (a graph output never takes an input's buffer)


def _stem_then_clamp(case: str, batch_name: str | None = None) -> onnx.ModelProto:
    """CASES[case]'s channels-last QLinearConv, rewritten to NarrowConvU8, a byte lookup (a
    ReLU's clamp) reading its result and a dequantize of that: the stem of a CNN as the sim's
    session graph holds it."""
    shape, nchw, outputs, kernel, strides, dilations, pads = CASES[case]
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    model = narrow_qlinearconv(rng, shape, outputs, kernel, strides, dilations, pads, nchw=nchw)
    model.graph.node[-1].output[0] = "conv_out"
    model.graph.initializer.extend([
        numpy_helper.from_array(RELU, "relu_table"),
        numpy_helper.from_array(np.array(STEP, np.float32), "step"),
        numpy_helper.from_array(np.array(100, np.uint8), "zero"),
    ])  # fmt: skip
    model.graph.node.extend([
        helper.make_node("LookupU8", ["relu_table", "conv_out"], ["clamped"], domain=DOMAIN),
        helper.make_node("DequantizeLinear", ["clamped", "step", "zero"], ["y"]),
    ])  # fmt: skip
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    if batch_name is not None:
        model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = batch_name
    assert rewrite_narrow(model) == 1
    return model


def _declared(model: onnx.ModelProto, name: str) -> list | None:
    for info in model.graph.value_info:
        if info.name == name:
            return [d.dim_value or d.dim_param for d in info.type.tensor_type.shape.dim]
    return None


def _conv_output_shape(model: onnx.ModelProto, x: np.ndarray) -> tuple:
    """The NarrowConv op's real output shape on x (the tensor made a graph output)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(helper.make_tensor_value_info("conv_out", TensorProto.UINT8, None))
    return op_session(probe).run(["conv_out"], {"x": x})[0].shape


def _runs_in_place(model: onnx.ModelProto, x: np.ndarray, runs: int = 3) -> tuple[int, list]:
    """(how many of `runs` session runs the lookup ran in place, each run's output)."""
    session = op_session(model)
    before = _C._lookups_in_place()
    outputs = [session.run(None, {"x": x})[0] for _ in range(runs)]
    return _C._lookups_in_place() - before, outputs


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_declared_shape_is_the_narrow_ops_output_shape(case):
    model = _stem_then_clamp(case)
    assert declare_shapes(model) == 1
    x = random_input(np.random.default_rng(1), CASES[case][0], TensorProto.UINT8)
    assert tuple(_declared(model, "conv_out")) == _conv_output_shape(model, x)
    assert declare_shapes(model) == 0  # declared once


def test_with_the_shape_declared_the_lookup_runs_in_place_with_the_same_bytes():
    case = "stem 3x3 s2 3->16"
    plain = _stem_then_clamp(case)
    declared = _stem_then_clamp(case)
    assert declare_shapes(declared) == 1
    x = random_input(np.random.default_rng(2), CASES[case][0], TensorProto.UINT8)
    in_place, got = _runs_in_place(declared, x)
    not_in_place, want = _runs_in_place(plain, x)
    assert (in_place, not_in_place) == (3, 0)
    # the clamp of the conv's own output, in every run (the reused buffer holds nothing stale)
    conv = _stem_then_clamp(case)
    del conv.graph.node[-2:]
    conv.graph.output[0].name = "conv_out"
    conv.graph.output[0].type.tensor_type.elem_type = TensorProto.UINT8
    clamped = RELU[op_session(conv).run(None, {"x": x})[0]]
    reference = (clamped.astype(np.float32) - 100) * np.float32(STEP)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, reference)
        np.testing.assert_array_equal(b, reference)
    assert len(np.unique(clamped)) > 20


def test_a_symbolic_batch_keeps_its_name_and_the_lookup_still_runs_in_place():
    case = "3->32, 35 wide (a 16-pixel SIMD tail)"
    model = _stem_then_clamp(case, batch_name="batch")
    assert declare_shapes(model) == 1
    assert _declared(model, "conv_out") == ["batch", 10, 18, 32]
    x = random_input(np.random.default_rng(3), CASES[case][0], TensorProto.UINT8)
    assert _conv_output_shape(model, x) == (2, 10, 18, 32)
    assert _runs_in_place(model, x)[0] == 3


def test_nothing_is_declared_where_the_shape_is_not_known_here():
    case = "1x1"
    unknown = _stem_then_clamp(case)
    unknown.graph.input[0].type.tensor_type.ClearField("shape")
    spatial = _stem_then_clamp(case)
    spatial.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "height"
    for model in (unknown, spatial):
        assert declare_shapes(model) == 0
        x = random_input(np.random.default_rng(4), CASES[case][0], TensorProto.UINT8)
        in_place, outputs = _runs_in_place(model, x, runs=1)
        assert in_place == 0 and outputs[0].shape == (1, 5, 7, 8)


def test_depthwise_pair_gemm_and_qlinear_conv_outputs_are_declared_through_lookups():
    """From a known input through a byte lookup (x's shape), a channels-last QLinearConv
    (stride 2: [1, 8, 8, 16] -> [1, 4, 4, 32]), a DepthwiseConv (5x5, pads 2, stride 1), a
    PairGemm (32 -> 24 columns) and a Gemv (24 -> 10 columns, x's leading dimensions kept): the
    extension's ops' outputs are declared, ORT's are not."""
    u8 = TensorProto.UINT8
    inits = [
        numpy_helper.from_array(np.zeros([32, 16, 3, 3], np.int8), "w"),
        numpy_helper.from_array(np.zeros([32], np.float32), "dw_bias"),
        numpy_helper.from_array(np.array([5, 5, 1, 1, 2, 2, 2, 2, 1, 1, 0, 0, 0], np.int64), "g"),
        numpy_helper.from_array(np.zeros([24], np.int32), "corr"),
        numpy_helper.from_array(np.array([32, 0, 0], np.int64), "pg"),
        numpy_helper.from_array(np.zeros([10], np.int32), "gemv_corr"),
    ]
    q = ["s", "z", "w", "s", "z", "s", "z"]
    nodes = [
        helper.make_node("LookupU8", ["t", "x"], ["a"], domain=DOMAIN),
        helper.make_node(
            "QLinearConv",
            ["a", *q],
            ["b"],
            domain="com.microsoft",
            channels_last=1,
            kernel_shape=[3, 3],
            strides=[2, 2],
            pads=[1, 1, 1, 1],
        ),  # fmt: skip
        helper.make_node(
            "DepthwiseConvU8", ["b", "dw_w", "dw_bias", "dw_s", "g"], ["c"], domain=DOMAIN
        ),  # fmt: skip
        helper.make_node("PairGemmU8", ["c", "pw", "corr", "ps", "pg"], ["d"], domain=DOMAIN),
        helper.make_node("GemvU8", ["d", "gw", "gemv_corr", "gs", "gg"], ["e"], domain=DOMAIN),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", u8, [1, 8, 8, 16])],
        [helper.make_tensor_value_info("e", u8, None)], inits,
    )  # fmt: skip
    model = helper.make_model(graph)
    assert declare_shapes(model) == 2  # "e" is a graph output: declared there already
    assert _declared(model, "c") == [1, 4, 4, 32] and _declared(model, "d") == [1, 4, 4, 24]
    assert _declared(model, "a") is None and _declared(model, "b") is None
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("f", u8, None))
    assert declare_shapes(model) == 1
    assert _declared(model, "e") == [1, 4, 4, 10]


class _ReluNet(torch.nn.Module):
    """A stem over 3 channels, then convs each followed by a ReLU or ReLU6: the sim's clamps."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.a = torch.nn.Conv2d(16, 32, 1)
        self.b = torch.nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.c = torch.nn.Conv2d(32, 24, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        x = torch.nn.functional.relu6(self.a(x))
        x = torch.nn.functional.relu6(self.b(x))
        return self.c(x)


def test_a_compiled_relu_network_runs_its_clamps_in_place_with_the_same_outputs():
    from torch_fl import bpu

    torch.manual_seed(0)
    model = _ReluNet().eval()
    samples = [torch.randn(2, 3, 32, 32) for _ in range(4)]
    x = torch.randn(2, 3, 32, 32)
    outs = {}
    for lookups in (True, False):
        torch._dynamo.reset()
        options = {"executor": "sim", "sim_lookups": lookups, "cache": False}
        compiled = torch.compile(model, backend="bpu", options=options)
        bpu.calibrate(compiled, samples)
        with torch.no_grad():
            compiled(x)
            before = _C._lookups_in_place()
            outs[lookups] = compiled(x)
            ran = _C._lookups_in_place() - before
        # three clamps, each over its input's buffer; none without the lookups
        assert ran == (3 if lookups else 0)
    torch.testing.assert_close(outs[True], outs[False], rtol=0, atol=0)

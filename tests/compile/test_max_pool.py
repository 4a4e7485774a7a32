"""The sim's channels-first 8-bit max pool op (csrc/runtime/ort_maxpool.cpp,
torch_fl/bpu/conversion/max_pool.py): equal to ONNX Runtime's own MaxPool byte for byte in both
forms; which pools the rewrite takes; bad input; a compiled model with the op on and off."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tests.support.sim_ops import NP, compiled_both_ways, conv_graph, op_session, random_input
from torch_fl.bpu.conversion.max_pool import candidates, rewrite_max_pools

ort = pytest.importorskip("onnxruntime")


def _pool(shape, x_type=TensorProto.UINT8, **attrs) -> onnx.ModelProto:
    return conv_graph([helper.make_node("MaxPool", ["x"], ["y"], **attrs)], [], shape, x_type)


def _same(model: onnx.ModelProto, shape, x_type: int, threads: int = 1) -> None:
    """ORT's MaxPool against the op in both forms, on two random inputs, byte for byte."""
    expected_ops = {TensorProto.UINT8: "MaxPoolU8", TensorProto.INT8: "MaxPoolI8"}[x_type]
    for seed in range(2):
        x = random_input(np.random.default_rng(seed), shape, x_type)
        expected = op_session(model, threads).run(None, {"x": x})[0]
        for form in (0, 1):
            rewritten = onnx.ModelProto()
            rewritten.CopyFrom(model)
            assert rewrite_max_pools(rewritten, form) == 1
            assert [n.op_type for n in rewritten.graph.node] == [expected_ops]
            got = op_session(rewritten, threads).run(None, {"x": x})[0]
            assert got.dtype == expected.dtype == NP[x_type]
            assert got.shape == expected.shape
            np.testing.assert_array_equal(got, expected)


GEOMETRIES = [
    # (shape, kernel, strides, pads (top, left, bottom, right), dilations)
    ([1, 64, 112, 112], [3, 3], [2, 2], [1, 1, 1, 1], [1, 1]),  # a ResNet / DenseNet stem
    ([1, 96, 55, 55], [3, 3], [2, 2], [0, 0, 0, 0], [1, 1]),  # AlexNet / SqueezeNet
    ([2, 5, 17, 70], [2, 2], [2, 2], [0, 0, 0, 0], [1, 1]),  # 2x2 stride 2, a row tail of 35
    ([1, 3, 9, 9], [3, 3], [1, 1], [1, 1, 1, 1], [1, 1]),  # stride 1, same size
    ([2, 4, 23, 41], [3, 2], [1, 3], [1, 0, 2, 1], [2, 1]),  # asymmetric everything
    ([1, 2, 7, 200], [1, 5], [1, 4], [0, 2, 0, 2], [1, 3]),  # wide row, dilated columns
    ([1, 1, 1, 1], [1, 1], [1, 1], [0, 0, 0, 0], [1, 1]),  # one pixel
    ([1, 2, 4, 4], [3, 3], [3, 3], [2, 2, 2, 2], [1, 1]),  # windows mostly padding
]


@pytest.mark.parametrize("x_type", [TensorProto.UINT8, TensorProto.INT8], ids=["u8", "s8"])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "x".join(map(str, g[0])))
def test_op_equals_ort_maxpool_byte_for_byte(geometry, x_type):
    shape, kernel, strides, pads, dilations = geometry
    model = _pool(
        shape, x_type, kernel_shape=kernel, strides=strides, pads=pads, dilations=dilations
    )
    _same(model, shape, x_type)


def test_op_on_two_threads_and_default_attributes():
    # no strides, pads or dilations set: ONNX's defaults (1, 0, 1)
    shape = [3, 40, 30, 30]
    _same(_pool(shape, kernel_shape=[2, 3]), shape, TensorProto.UINT8, threads=2)


def _float_pool_graph() -> onnx.ModelProto:
    nodes = [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2])]
    return conv_graph(nodes, [], [1, 2, 4, 4], TensorProto.FLOAT)


@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [3, 3], "ceil_mode": 1},
        {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER"},
        {"kernel_shape": [3]},
    ],
    ids=["ceil_mode", "auto_pad", "1-D"],
)
def test_pools_the_op_does_not_compute_alike_stay_ort(attrs):
    shape = [1, 2, 8, 8] if len(attrs["kernel_shape"]) == 2 else [1, 2, 8]
    model = _pool(shape, **attrs)
    assert rewrite_max_pools(model) == 0
    assert [n.op_type for n in model.graph.node] == ["MaxPool"]


def test_two_unnamed_pools_get_their_own_geometry():
    shape = [1, 2, 8, 8]
    nodes = [
        helper.make_node("MaxPool", ["x"], ["a"], kernel_shape=[2, 2]),
        helper.make_node("MaxPool", ["a"], ["y"], kernel_shape=[3, 3], strides=[2, 2]),
    ]
    model = conv_graph(nodes, [], shape, TensorProto.UINT8)
    x = random_input(np.random.default_rng(0), shape, TensorProto.UINT8)
    expected = op_session(model).run(None, {"x": x})[0]
    assert rewrite_max_pools(model) == 2
    assert len({i.name for i in model.graph.initializer}) == 2
    np.testing.assert_array_equal(op_session(model).run(None, {"x": x})[0], expected)


def test_a_pool_with_indices_or_of_floats_stays_ort():
    assert rewrite_max_pools(_float_pool_graph()) == 0
    model = conv_graph(
        [helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2])],
        [], [1, 2, 4, 4], TensorProto.UINT8,
    )  # fmt: skip
    assert rewrite_max_pools(model) == 0


def test_the_byte_type_is_found_through_what_writes_or_reads_the_tensor():
    # x is float; a Q writes int8, a Transpose and a Concat keep it, the pool reads that; the
    # second pool reads a tensor that only a DequantizeLinear with a uint8 zero point types
    inits = [
        numpy_helper.from_array(np.array(0.1, np.float32), "s"),
        numpy_helper.from_array(np.array(0, np.int8), "z8"),
        numpy_helper.from_array(np.array(128, np.uint8), "zu"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z8"], ["q"]),
        helper.make_node("Transpose", ["q"], ["t0"], perm=[0, 1, 3, 2]),
        helper.make_node("Concat", ["t0", "q"], ["t"], axis=1),
        helper.make_node("MaxPool", ["t"], ["p"], kernel_shape=[2, 2]),
        helper.make_node("DequantizeLinear", ["p", "s", "z8"], ["f"]),
        helper.make_node("QuantizeLinear", ["f", "s", "zu"], ["u"]),
        helper.make_node("Identity", ["u"], ["opaque"]),
        helper.make_node("MaxPool", ["opaque"], ["p2"], kernel_shape=[1, 1]),
        helper.make_node("DequantizeLinear", ["p2", "s", "zu"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(0).standard_normal((1, 2, 6, 6)).astype(np.float32) * 10
    expected = op_session(model).run(None, {"x": x})[0]
    assert candidates(model) == 2
    assert rewrite_max_pools(model) == 2
    assert [n.op_type for n in model.graph.node if "MaxPool" in n.op_type] == [
        "MaxPoolI8",
        "MaxPoolU8",
    ]
    np.testing.assert_array_equal(op_session(model).run(None, {"x": x})[0], expected)


def _op_graph(shape, geometry, x_type=TensorProto.UINT8, op="MaxPoolU8") -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.array(geometry, np.int64), "g")]
    node = helper.make_node(op, ["x", "g"], ["y"], domain="torch_fl.bpu")
    model = conv_graph([node], inits, shape, x_type)
    model.opset_import.append(helper.make_opsetid("torch_fl.bpu", 1))
    return model


@pytest.mark.parametrize(
    "shape, geometry, message",
    [
        ([1, 1, 4, 4], [3, 3, 1, 1, 0, 0, 0, 0, 1, 1], "11 int64"),
        ([1, 1, 4, 4], [3, 3, 0, 1, 0, 0, 0, 0, 1, 1, 0], "out of range"),
        ([1, 1, 4, 4], [3, 3, 1, 1, -1, 0, 0, 0, 1, 1, 0], "out of range"),
        ([1, 1, 4, 4], [3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 2], "form 0 or 1"),
        ([1, 1, 4, 4], [2**40, 3, 1, 1, 0, 0, 0, 0, 2**40, 1, 0], "out of range"),
        ([1, 1, 4, 4], [1, 1, 1, 1, 0, 0, 2**62, 0, 1, 1, 0], "out of range"),
        ([1, 1, 2, 2], [3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 0], "smaller than the kernel"),
        ([1, 4, 4], [1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0], "4-D tensor"),
    ],
)
def test_bad_geometry_or_input_is_refused_with_what_is_wrong(shape, geometry, message):
    model = _op_graph(shape, geometry)
    x = np.zeros(shape, np.uint8)
    with pytest.raises(Exception, match=message):
        op_session(model).run(None, {"x": x})


def test_a_wrong_byte_type_is_refused():
    # the op declares its input type: ONNX Runtime refuses the graph before it runs
    model = _op_graph([1, 1, 4, 4], [1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0], TensorProto.INT8)
    with pytest.raises(Exception, match=r"tensor\(int8\).*MaxPoolU8"):
        op_session(model).run(None, {"x": np.zeros((1, 1, 4, 4), np.int8)})


class _DenseStem(torch.nn.Module):
    """DenseNet's stem: the pool's output feeds a concat and a batch norm, not a conv alone, so
    ORT's layout pass leaves the pool channels-first."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16),
            torch.nn.ReLU(), torch.nn.MaxPool2d(3, stride=2, padding=1),
        )  # fmt: skip
        self.norm = torch.nn.BatchNorm2d(16)
        self.conv = torch.nn.Conv2d(16, 8, 3, padding=1)

    def forward(self, x):
        pooled = self.stem(x)
        grown = self.conv(torch.relu(self.norm(pooled)))
        return torch.cat([pooled, grown], 1)


def test_compiled_model_is_unchanged_by_the_op_and_explain_counts_it():
    torch.manual_seed(0)
    model = _DenseStem().eval()
    with torch.no_grad():  # batch norms as training leaves them, not the identity
        for bn in (model.stem[1], model.norm):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 3, 32, 32)
    samples = [torch.randn(2, 3, 32, 32) for _ in range(3)]
    outs, runtimes, lines = compiled_both_ways(model, x, samples, "sim_depthwise", "max pool")
    assert sum(r._exec.pools for r in runtimes[True]) == 1  # on every CPU
    assert sum(r._exec.pools for r in runtimes[False]) == 0
    assert len(lines[True]) == 1 and not lines[False]
    assert "1 channels-first 8-bit max pool on the extension's op" in lines[True][0]
    for a, b in zip(outs[True], outs[False], strict=True):
        assert torch.equal(a, b)

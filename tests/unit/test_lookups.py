"""The sim's table lookups (conversion/lookups.py, csrc/runtime/ort_lookup.cpp): each replaced
chain gives, in a real ONNX Runtime session, exactly the float path's numbers; what must not be
replaced is not; bad input to the op is refused by name."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from torch_fl import _C
from torch_fl.bpu.conversion.lookups import DOMAIN, ELEMENTWISE, fuse_lookups
from torch_fl.bpu.runtime.executors import lookup_library

U8, I8, F = TensorProto.UINT8, TensorProto.INT8, TensorProto.FLOAT
NP = {U8: np.uint8, I8: np.int8}


def _scalar(name: str, value, dtype) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, dtype=dtype), name)


def _model(nodes, inputs, out_type=U8, extra_inits=(), out_shape=None) -> onnx.ModelProto:
    """inputs: (name, 8-bit type, shape, scale, zero point); each is dequantized to `<name>_f`;
    `nodes` compute float `y_f` from those; y = Q(y_f, 0.05, zero point of out_type)."""
    graph_inputs, inits, all_nodes = [], list(extra_inits), []
    for name, kind, shape, scale, zero in inputs:
        graph_inputs.append(helper.make_tensor_value_info(name, kind, shape))
        inits += [_scalar(f"{name}_s", scale, np.float32), _scalar(f"{name}_z", zero, NP[kind])]
        all_nodes.append(
            helper.make_node("DequantizeLinear", [name, f"{name}_s", f"{name}_z"], [f"{name}_f"])
        )
    inits += [
        _scalar("y_s", 0.05, np.float32),
        _scalar("y_z", 128 if out_type == U8 else 0, NP[out_type]),
    ]
    all_nodes += nodes
    all_nodes.append(helper.make_node("QuantizeLinear", ["y_f", "y_s", "y_z"], ["y"]))
    out = helper.make_tensor_value_info("y", out_type, out_shape)
    graph = helper.make_graph(all_nodes, "chain", graph_inputs, [out], inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def _run(model: onnx.ModelProto, feed: dict, lookups: bool) -> np.ndarray:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if lookups:
        options.register_custom_ops_library(lookup_library())
    else:
        options.add_session_config_entry("session.disable_quant_qdq", "1")  # the float path
    session = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    return session.run(None, feed)[0]


def _fused(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy, fuse_lookups(copy)


def _bytes(shape, kind, seed=0) -> np.ndarray:
    # every byte value many times, in a length no vector width divides
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8).view(NP[kind])


# one chain per ELEMENTWISE op: (nodes computing y_f from x_f, extra initializers)
def _unary(op, domain="", **attrs):
    return [helper.make_node(op, ["x_f"], ["y_f"], domain=domain, **attrs)], []


def _binary_const(op, value):
    return [helper.make_node(op, ["x_f", "c"], ["y_f"])], [_scalar("c", value, np.float32)]


CHAINS = {
    "Abs": _unary("Abs"),
    "Add": _binary_const("Add", 0.37),
    "Clip": (
        [helper.make_node("Clip", ["x_f", "lo", "hi"], ["y_f"])],
        [_scalar("lo", -0.5, np.float32), _scalar("hi", 0.8, np.float32)],
    ),
    "Div": _binary_const("Div", 3.1),
    "Elu": _unary("Elu", alpha=0.7),
    "Erf": _unary("Erf"),
    "Exp": _unary("Exp"),
    "HardSigmoid": _unary("HardSigmoid", alpha=1 / 6, beta=0.5),
    "HardSwish": _unary("HardSwish"),
    "LeakyRelu": _unary("LeakyRelu", alpha=0.1),
    "Max": _binary_const("Max", -0.3),
    "Min": _binary_const("Min", 0.6),
    "Mul": _binary_const("Mul", 1.7),
    "Neg": _unary("Neg"),
    "Relu": _unary("Relu"),
    "Sigmoid": _unary("Sigmoid"),
    "Softplus": _unary("Softplus"),
    "Sqrt": (
        [helper.make_node("Abs", ["x_f"], ["a"]), helper.make_node("Sqrt", ["a"], ["y_f"])],
        [],
    ),
    "Sub": _binary_const("Sub", 0.25),
    "Tanh": _unary("Tanh"),
    "Gelu": _unary("Gelu", domain="com.microsoft"),
    "FastGelu": _unary("FastGelu", domain="com.microsoft"),
    "QuickGelu": _unary("QuickGelu", domain="com.microsoft", alpha=1.0),
}


def test_every_listed_op_has_a_chain_here():
    assert {op for _, op in ELEMENTWISE} == set(CHAINS)


@pytest.mark.parametrize("op", sorted(CHAINS))
@pytest.mark.parametrize("in_type,out_type", [(U8, U8), (I8, I8), (U8, I8)])
def test_a_table_gives_the_float_ops_numbers_on_long_tensors(op, in_type, out_type):
    nodes, inits = CHAINS[op]
    zero = 131 if in_type == U8 else -3
    model = _model(nodes, [("x", in_type, [3, 2051], 0.043, zero)], out_type, inits)
    fused, count = _fused(model)
    assert count == 1
    assert [n.op_type for n in fused.graph.node] == [f"Lookup{'U8' if out_type == U8 else 'I8'}"]
    feed = {"x": _bytes([3, 2051], in_type)}
    np.testing.assert_array_equal(_run(fused, feed, True), _run(model, feed, False))


def test_silu_over_two_copies_of_one_dequantize_is_one_input():
    # QDQ graphs give each reader its own DQ: both copies are the same input
    model = _model(
        [
            helper.make_node("DequantizeLinear", ["x", "x_s", "x_z"], ["x_f2"]),
            helper.make_node("Sigmoid", ["x_f"], ["s"]),
            helper.make_node("Mul", ["x_f2", "s"], ["y_f"]),
        ],
        [("x", U8, [5, 999], 0.05, 128)],
    )
    fused, count = _fused(model)
    assert count == 1 and [n.op_type for n in fused.graph.node] == ["LookupU8"]
    feed = {"x": _bytes([5, 999], U8, 1)}
    np.testing.assert_array_equal(_run(fused, feed, True), _run(model, feed, False))


@pytest.mark.parametrize("first", ["s", "x"])
def test_a_per_channel_scale_is_a_two_input_table_over_the_broadcast(first):
    # squeeze-excitation: x * hardsigmoid(s), s one value per channel
    s_node = helper.make_node("HardSigmoid", ["s_f"], ["h"], alpha=1 / 6, beta=0.5)
    operands = ["h", "x_f"] if first == "s" else ["x_f", "h"]
    model = _model(
        [s_node, helper.make_node("Mul", operands, ["y_f"])],
        [("x", U8, [2, 6, 9, 11], 0.04, 128), ("s", U8, [2, 6, 1, 1], 0.1, 120)],
        out_shape=[2, 6, 9, 11],
    )
    fused, count = _fused(model)
    assert count == 1
    (node,) = fused.graph.node
    # a product of one float per byte of each (conversion/pair_product.py), the smaller first
    assert node.op_type == "Lookup2MulU8" and list(node.input[1:3]) == ["s", "x"]
    feed = {"x": _bytes([2, 6, 9, 11], U8, 2), "s": _bytes([2, 6, 1, 1], U8, 3)}
    np.testing.assert_array_equal(_run(fused, feed, True), _run(model, feed, False))


@pytest.mark.parametrize(
    "a_shape,b_shape",
    [([4, 1, 7], [1, 5, 7]), ([3, 8], [3, 8]), ([6, 1], [6, 300]), ([1], [2, 3, 4])],
)
def test_two_input_tables_broadcast_as_onnx_does(a_shape, b_shape):
    nodes = [
        helper.make_node("Add", ["a_f", "b_f"], ["t"]),
        helper.make_node("Relu", ["t"], ["y_f"]),
    ]
    model = _model(nodes, [("a", U8, a_shape, 0.03, 100), ("b", I8, b_shape, 0.02, 4)])
    fused, count = _fused(model)
    assert count == 1 and fused.graph.node[0].domain == DOMAIN
    feed = {"a": _bytes(a_shape, U8, 4), "b": _bytes(b_shape, I8, 5)}
    got, want = _run(fused, feed, True), _run(model, feed, False)
    assert got.shape == want.shape == tuple(np.broadcast_shapes(a_shape, b_shape))
    np.testing.assert_array_equal(got, want)


def _shape(name: str, dims) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(dims, np.int64), name)


def test_reshapes_around_a_one_input_chain_move_before_the_lookup():
    # the exporter's flatten around a Linear's GELU
    nodes = [
        helper.make_node("Reshape", ["x_f", "flat"], ["r"]),
        helper.make_node("Gelu", ["r"], ["g"], domain="com.microsoft"),
        helper.make_node("Reshape", ["g", "back"], ["u"]),
        helper.make_node("Unsqueeze", ["u", "axis0"], ["y_f"]),
    ]
    inits = [_shape("flat", [-1, 6]), _shape("back", [2, 5, 6]), _shape("axis0", [0])]
    model = _model(nodes, [("x", U8, [2, 5, 6], 0.05, 128)], U8, inits)
    fused, count = _fused(model)
    assert count == 1
    # on the bytes, in their order; then the lookup (conversion/lookups.py SHAPE_OPS)
    assert [n.op_type for n in fused.graph.node] == ["Reshape", "Reshape", "Unsqueeze", "LookupU8"]
    feed = {"x": _bytes([2, 5, 6], U8, 8)}
    got, want = _run(fused, feed, True), _run(model, feed, False)
    assert got.shape == want.shape == (1, 2, 5, 6)
    np.testing.assert_array_equal(got, want)


def _int64(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


# attention's q, k and v: gathered from one dequantized [3, ...] tensor, each quantized at its
# own scale (ViT-S/16's 24 such chains in the sim's graph)
MOVES = [
    helper.make_node("Squeeze", ["x_f", "axis1"], ["sq"]),
    helper.make_node("Gather", ["sq", "which"], ["g"], axis=0),
    helper.make_node("Transpose", ["g"], ["t"], perm=[0, 2, 1]),
    helper.make_node("Slice", ["t", "starts", "ends", "axes"], ["y_f"]),
]
MOVE_INITS = [
    _int64("axis1", [1]), _int64("which", 1), _int64("starts", [1]), _int64("ends", [8]),
    _int64("axes", [2]),
]  # fmt: skip


@pytest.mark.parametrize("in_type,zero", [(U8, 120), (I8, -7)])
def test_moves_alone_between_two_scales_are_byte_moves_and_a_requantizing_lookup(in_type, zero):
    model = _model(MOVES, [("x", in_type, [3, 1, 4, 9, 11], 0.043, zero)], U8, MOVE_INITS)
    fused, count = _fused(model)
    assert count == 1
    ops = [n.op_type for n in fused.graph.node]
    assert ops == ["Squeeze", "Gather", "Transpose", "Slice", "LookupU8"]
    feed = {"x": _bytes([3, 1, 4, 9, 11], in_type, 9)}
    got, want = _run(fused, feed, True), _run(model, feed, False)
    assert got.shape == want.shape == (4, 11, 7)
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(got)) > 100  # a requantization, not a constant


def test_moves_between_a_dequantize_and_a_quantize_of_one_scale_are_the_moves_alone():
    model = _model(MOVES, [("x", U8, [3, 1, 4, 9, 11], 0.05, 128)], U8, MOVE_INITS)
    fused, count = _fused(model)
    assert count == 1
    assert [n.op_type for n in fused.graph.node] == ["Squeeze", "Gather", "Transpose", "Slice"]
    assert not [i for i in fused.graph.initializer if i.name.startswith("lookup_table::")]
    feed = {"x": _bytes([3, 1, 4, 9, 11], U8, 10)}
    np.testing.assert_array_equal(_run(fused, feed, True), _run(model, feed, False))


def test_a_gather_in_a_function_chain_moves_before_its_lookup():
    nodes = [
        helper.make_node("Gather", ["x_f", "which"], ["g"], axis=1),
        helper.make_node("Sigmoid", ["g"], ["y_f"]),
    ]
    model = _model(nodes, [("x", I8, [5, 4, 301], 0.05, 3)], U8, [_int64("which", [3, 0, 3])])
    fused, count = _fused(model)
    assert count == 1
    assert [n.op_type for n in fused.graph.node] == ["Gather", "LookupU8"]
    feed = {"x": _bytes([5, 4, 301], I8, 11)}
    got, want = _run(fused, feed, True), _run(model, feed, False)
    assert got.shape == want.shape == (5, 3, 301)
    np.testing.assert_array_equal(got, want)


def test_two_chains_gathering_from_one_dequantize_leave_it_unread():
    """ViT's q and k: both chains become byte gathers and lookups, and the float dequantize
    of the whole tensor, read by nothing else, goes."""
    x = helper.make_tensor_value_info("x", U8, [3, 6, 10])
    inits = [
        _scalar("x_s", 0.03, np.float32), _scalar("x_z", 128, np.uint8),
        _scalar("q_s", 0.02, np.float32), _scalar("k_s", 0.04, np.float32),
        _scalar("z", 128, np.uint8), _int64("i0", 0), _int64("i1", 1),
    ]  # fmt: skip
    nodes = [helper.make_node("DequantizeLinear", ["x", "x_s", "x_z"], ["x_f"])]
    outputs = []
    for name, index in (("q", "i0"), ("k", "i1")):
        nodes.append(helper.make_node("Gather", ["x_f", index], [f"{name}_f"], axis=0))
        nodes.append(helper.make_node("QuantizeLinear", [f"{name}_f", f"{name}_s", "z"], [name]))
        outputs.append(helper.make_tensor_value_info(name, U8, None))
    graph = helper.make_graph(nodes, "qk", [x], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    fused, count = _fused(model)
    assert count == 2
    assert sorted(n.op_type for n in fused.graph.node) == [
        "Gather",
        "Gather",
        "LookupU8",
        "LookupU8",
    ]
    feed = {"x": _bytes([3, 6, 10], U8, 12)}
    np.testing.assert_array_equal(_run(fused, feed, True), _run(model, feed, False))


def test_a_gather_of_indices_given_at_run_time_is_left():
    # the same chain as a fused one but for its indices, a graph input: not a constant move
    model = _model(
        [helper.make_node("Gather", ["x_f", "idx"], ["y_f"], axis=0)],
        [("x", U8, [4, 6], 0.043, 128)],
    )
    model.graph.input.append(helper.make_tensor_value_info("idx", TensorProto.INT64, [2]))
    _not_fused(model)
    constant = _model(
        [helper.make_node("Gather", ["x_f", "idx"], ["y_f"], axis=0)],
        [("x", U8, [4, 6], 0.043, 128)],
        extra_inits=[_int64("idx", [2, 0])],
    )
    assert _fused(constant)[1] == 1


def test_branches_reshaped_differently_or_shapes_computed_at_run_time_are_left():
    # x * sigmoid(x viewed transposed-by-reshape): pairs different elements; not one byte's function
    branches = [
        helper.make_node("Reshape", ["x_f", "swap"], ["r"]),
        helper.make_node("Sigmoid", ["r"], ["s"]),
        helper.make_node("Mul", ["x_f", "s"], ["y_f"]),
    ]
    _not_fused(_model(branches, [("x", U8, [4, 4], 0.05, 128)], U8, [_shape("swap", [4, 4])]))
    computed = [
        helper.make_node("Shape", ["x_f"], ["dims"]),
        helper.make_node("Reshape", ["x_f", "dims"], ["r"]),
        helper.make_node("Tanh", ["r"], ["y_f"]),
    ]
    _not_fused(_model(computed, [("x", U8, [4, 4], 0.05, 128)]))


def test_pairs_at_the_end_of_the_table_are_looked_up_too():
    # the vector form reads 4 bytes a pair: the last entries are read one by one instead
    table = np.random.default_rng(9).integers(0, 256, 65536, dtype=np.uint8)
    a = np.full((2, 40), 255, np.uint8)
    b = np.tile(np.arange(216, 256, dtype=np.uint8), (2, 1))
    a[1, ::3] = np.arange(14, dtype=np.uint8) * 17  # other rows in between
    model = _op_model("Lookup2U8", table, [(U8, [2, 40]), (U8, [2, 40])])
    out = _session(model).run(None, {"in0": a, "in1": b})[0]
    np.testing.assert_array_equal(out, table[a.astype(np.int64) * 256 + b])


def _not_fused(model: onnx.ModelProto) -> None:
    before = [n.op_type for n in model.graph.node]
    fused, count = _fused(model)
    assert count == 0
    assert [n.op_type for n in fused.graph.node] == before


def test_a_per_channel_constant_is_no_function_of_one_byte():
    inits = [numpy_helper.from_array(np.array([1.0, 2.0, 3.0], np.float32).reshape(3, 1), "c")]
    _not_fused(
        _model(
            [helper.make_node("Mul", ["x_f", "c"], ["y_f"])],
            [("x", U8, [3, 10], 0.05, 128)],
            extra_inits=inits,
        )
    )


def test_a_single_add_of_two_tensors_is_left_to_ort_integer_kernel():
    _not_fused(
        _model(
            [helper.make_node("Add", ["a_f", "b_f"], ["y_f"])],
            [("a", U8, [4, 4], 0.05, 128), ("b", U8, [4, 4], 0.05, 128)],
        )
    )


def test_three_inputs_and_non_elementwise_ops_are_left():
    _not_fused(
        _model(
            [
                helper.make_node("Add", ["a_f", "b_f"], ["t"]),
                helper.make_node("Add", ["t", "c_f"], ["y_f"]),
            ],
            [("a", U8, [4], 0.05, 128), ("b", U8, [4], 0.05, 128), ("c", U8, [4], 0.05, 128)],
        )
    )
    _not_fused(
        _model(
            [helper.make_node("Softmax", ["x_f"], ["y_f"], axis=-1)],
            [("x", U8, [2, 8], 0.05, 128)],
        )
    )


def test_a_per_axis_dequantize_is_left():
    model = _model([helper.make_node("Relu", ["x_f"], ["y_f"])], [("x", U8, [3, 4], 0.05, 128)])
    dq = model.graph.node[0]
    for init in model.graph.initializer:
        if init.name == "x_s":
            init.CopyFrom(numpy_helper.from_array(np.array([0.1, 0.2, 0.3], np.float32), "x_s"))
        if init.name == "x_z":
            init.CopyFrom(numpy_helper.from_array(np.array([128, 128, 128], np.uint8), "x_z"))
    dq.attribute.append(helper.make_attribute("axis", 0))
    _not_fused(model)


def _with_float_reader(model: onnx.ModelProto, reader: onnx.NodeProto) -> onnx.ModelProto:
    model.graph.node.append(reader)
    model.graph.output.append(helper.make_tensor_value_info(reader.output[0], F, None))
    return model


def _same_outputs(fused: onnx.ModelProto, model: onnx.ModelProto, feed: dict) -> None:
    options = ort.SessionOptions()
    options.register_custom_ops_library(lookup_library())
    got = ort.InferenceSession(fused.SerializeToString(), options).run(None, feed)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    want = ort.InferenceSession(model.SerializeToString(), options).run(None, feed)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_a_result_also_read_as_float_becomes_a_float_table_for_that_reader():
    # squeeze-excitation's hardswish: it feeds a float ReduceMean and a quantized output
    model = _with_float_reader(
        _model(
            [helper.make_node("HardSwish", ["x_f"], ["y_f"])], [("x", U8, [2, 3, 5, 5], 0.05, 128)]
        ),
        helper.make_node("ReduceMean", ["y_f"], ["m"], axes=[2, 3]),
    )
    fused, count = _fused(model)
    assert count == 2
    assert sorted(n.op_type for n in fused.graph.node) == ["LookupF32", "LookupU8", "ReduceMean"]
    _same_outputs(fused, model, {"x": _bytes([2, 3, 5, 5], U8, 6)})


@pytest.mark.parametrize("op", sorted(CHAINS))
def test_a_float_table_gives_the_float_ops_numbers(op):
    nodes, inits = CHAINS[op]
    model = _model(nodes, [("x", I8, [7, 1031], 0.031, -5)], U8, inits)
    # the float result read by a Softmax as well as quantized
    model = _with_float_reader(model, helper.make_node("Softmax", ["y_f"], ["p"], axis=-1))
    fused, count = _fused(model)
    assert count == 2 and "LookupF32" in {n.op_type for n in fused.graph.node}
    _same_outputs(fused, model, {"x": _bytes([7, 1031], I8, 7)})


def test_a_float_result_that_is_a_graph_output_or_has_two_inputs_stays():
    model = _model(
        [helper.make_node("Add", ["a_f", "b_f"], ["t"]), helper.make_node("Relu", ["t"], ["y_f"])],
        [("a", U8, [4], 0.05, 128), ("b", U8, [4], 0.05, 128)],
    )
    model = _with_float_reader(model, helper.make_node("Softmax", ["t"], ["p"], axis=-1))
    fused, count = _fused(model)
    assert count == 1  # the byte table only: t has two inputs
    assert "LookupF32" not in {n.op_type for n in fused.graph.node}
    model = _model([helper.make_node("Relu", ["x_f"], ["y_f"])], [("x", U8, [4], 0.05, 128)])
    model.graph.output.append(helper.make_tensor_value_info("y_f", F, None))
    fused, count = _fused(model)
    assert count == 1 and "Relu" in {n.op_type for n in fused.graph.node}


def _op_model(op: str, table: np.ndarray, inputs) -> onnx.ModelProto:
    names = [f"in{i}" for i in range(len(inputs))]
    graph = helper.make_graph(
        [helper.make_node(op, ["t", *names], ["y"], domain=DOMAIN)],
        "op",
        [helper.make_tensor_value_info(n, k, s) for n, (k, s) in zip(names, inputs, strict=True)],
        [helper.make_tensor_value_info("y", U8, None)],
        [numpy_helper.from_array(table, "t")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def _session(model):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.register_custom_ops_library(lookup_library())
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])


def test_the_op_refuses_a_table_of_the_wrong_size_by_name():
    model = _op_model("LookupU8", np.zeros(255, np.uint8), [(U8, [4])])
    with pytest.raises(Exception, match="table has 255 entries; it needs 256"):
        _session(model).run(None, {"in0": np.zeros(4, np.uint8)})


def test_the_op_refuses_a_wider_input_by_name():
    model = _op_model("LookupU8", np.zeros(256, np.uint8), [(TensorProto.INT32, [4])])
    with pytest.raises(Exception, match="must be uint8 or int8"):
        _session(model).run(None, {"in0": np.zeros(4, np.int32)})


def test_the_op_refuses_shapes_that_do_not_broadcast_by_name():
    model = _op_model("Lookup2U8", np.zeros(65536, np.uint8), [(U8, [3]), (U8, [4])])
    with pytest.raises(Exception, match=r"shapes \[3\] and \[4\] do not broadcast"):
        _session(model).run(None, {"in0": np.zeros(3, np.uint8), "in1": np.zeros(4, np.uint8)})


def test_the_op_on_empty_tensors_gives_empty_results():
    model = _op_model("Lookup2U8", np.zeros(65536, np.uint8), [(U8, [0, 3]), (U8, [1, 3])])
    out = _session(model).run(
        None, {"in0": np.zeros((0, 3), np.uint8), "in1": np.zeros((1, 3), np.uint8)}
    )[0]
    assert out.shape == (0, 3)


def test_a_float_lookup_refuses_a_byte_table_size_by_name():
    graph = helper.make_graph(
        [helper.make_node("LookupF32", ["t", "x"], ["y"], domain=DOMAIN)],
        "op",
        [helper.make_tensor_value_info("x", U8, [4])],
        [helper.make_tensor_value_info("y", F, None)],
        [numpy_helper.from_array(np.zeros(65536, np.float32), "t")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    with pytest.raises(Exception, match="table has 65536 entries; it needs 256"):
        _session(model).run(None, {"x": np.zeros(4, np.uint8)})


def _threaded_session(model, threads: int):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    options.register_custom_ops_library(lookup_library())
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])


# shapes whose outputs are split into pieces over the session's threads (ort_lookup.cpp
# run_pieces): slices of one long row, many short rows, rows longer than a piece
PAIR_SHAPES = [
    ([300007], [300007]),  # both along one row: sliced
    ([1], [500001]),  # one table row over a long input
    ([2, 57, 57, 24], [2, 1, 1, 24]),  # per-channel scale in NHWC: many short rows
    ([3, 16, 111, 113], [3, 16, 1, 1]),  # per-channel scale in NCHW
    ([3, 200003], [3, 1]),  # rows longer than a piece, the second operand fixed per row
    ([3, 1], [3, 200003]),
    ([64, 1, 4099], [1, 37, 1]),  # neither runs along the other's rows
    # per-channel in NHWC, rows run as one: the scale first (the table's rows), channels under
    # 16 (the repeated row read across its end), an odd count, pixels split over pieces
    ([3, 1, 1, 40], [3, 9, 7, 40]),
    ([2, 61, 67, 5], [2, 1, 1, 5]),
    ([1, 1, 1, 13], [1, 150, 130, 13]),
]


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("a_shape,b_shape", PAIR_SHAPES)
def test_a_pair_lookup_split_over_threads_is_exact(threads, a_shape, b_shape):
    _check_pairs(threads, a_shape, b_shape)


@pytest.mark.board
def test_on_this_cpu_lookups_split_over_two_threads_are_exact():
    """The board's check of the split (its ONNX Runtime's thread pool, the NEON form)."""
    for a_shape, b_shape in (PAIR_SHAPES[2], PAIR_SHAPES[4]):
        _check_pairs(2, a_shape, b_shape)


def _check_pairs(threads: int, a_shape, b_shape) -> None:
    rng = np.random.default_rng(7)
    table = rng.integers(0, 256, 65536, dtype=np.uint8)
    a, b = _bytes(a_shape, U8, 1), _bytes(b_shape, U8, 2)
    want = table[256 * a.astype(np.int64) + b]
    model = _op_model("Lookup2U8", table, [(U8, a_shape), (U8, b_shape)])
    got = _threaded_session(model, threads).run(None, {"in0": a, "in1": b})[0]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("threads", [2, 3])
# whole below a piece, then the first split of float results (2 x 4 K) and of bytes (2 x 16 K),
# then many pieces
@pytest.mark.parametrize("n", [4095, 8192, 32768, 262144, 1000003])
def test_one_input_lookups_split_over_threads_are_exact(threads, n):
    rng = np.random.default_rng(n)
    x = rng.integers(0, 256, n, dtype=np.uint8)
    table = rng.integers(0, 256, 256, dtype=np.uint8)
    got = _threaded_session(_op_model("LookupU8", table, [(U8, [n])]), threads)
    np.testing.assert_array_equal(got.run(None, {"in0": x})[0], table[x])
    floats = rng.standard_normal(256).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("LookupF32", ["t", "x"], ["y"], domain=DOMAIN)],
        "op",
        [helper.make_tensor_value_info("x", U8, [n])],
        [helper.make_tensor_value_info("y", F, None)],
        [numpy_helper.from_array(floats, "t")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    got = _threaded_session(model, threads).run(None, {"x": x})[0]
    assert got.tobytes() == floats[x].tobytes()


@pytest.mark.board
@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 63, 64, 65, 127, 1000, 4099])
def test_both_forms_of_each_lookup_agree(n):
    rng = np.random.default_rng(n)
    table = rng.integers(0, 256, 256, dtype=np.uint8)
    x = rng.integers(0, 256, n, dtype=np.uint8)
    want = table[x].tobytes()
    assert _C._lookup_bytes(table.tobytes(), x.tobytes()) == want
    assert _C._lookup_bytes(table.tobytes(), x.tobytes(), portable=True) == want
    assert _C._lookup_kernel() in ("avx512vbmi", "avx2", "neon", "portable")
    floats = rng.standard_normal(256).astype(np.float32)
    floats[:4] = [np.inf, -np.inf, -0.0, np.nan]  # every bit pattern comes back as it was
    want = floats[x].tobytes()
    assert _C._lookup_floats(floats.tobytes(), x.tobytes()) == want
    assert _C._lookup_floats(floats.tobytes(), x.tobytes(), portable=True) == want


@pytest.mark.board
def test_on_this_cpu_the_lookup_ops_load_and_give_the_float_ops_numbers():
    """The board's check (aarch64, its own ONNX Runtime build): the custom-op interface, each
    kind of table (a clamp of bytes among them), and a refusal, in a few sessions."""
    for op in ("HardSwish", "Sigmoid", "Gelu"):
        nodes, inits = CHAINS[op]
        model = _model(nodes, [("x", U8, [3, 515], 0.043, 131)], U8, inits)
        fused, count = _fused(model)
        assert count == 1
        feed = {"x": _bytes([3, 515], U8)}
        np.testing.assert_array_equal(_run(fused, feed, True), _run(model, feed, False))
    gate = [
        helper.make_node("HardSigmoid", ["s_f"], ["h"], alpha=1 / 6, beta=0.5),
        helper.make_node("Mul", ["x_f", "h"], ["y_f"]),
    ]
    model = _model(gate, [("x", U8, [2, 6, 9, 11], 0.04, 128), ("s", I8, [2, 6, 1, 1], 0.1, 3)])
    model = _with_float_reader(model, helper.make_node("ReduceMean", ["h"], ["m"], axes=[1]))
    fused, count = _fused(model)
    assert {n.op_type for n in fused.graph.node} >= {"Lookup2MulU8", "LookupF32"}
    _same_outputs(
        fused, model, {"x": _bytes([2, 6, 9, 11], U8, 2), "s": _bytes([2, 6, 1, 1], I8, 3)}
    )
    clamp = _clamp_model("Max", ["x", "z"], {"z": np.uint8(128)})  # a Relu after its Q
    fused, count = _fused(clamp)
    assert count == 1
    feed = {"x": _bytes([3, 2051], U8, 5)}
    np.testing.assert_array_equal(_run(fused, feed, True), _run(clamp, feed, False))
    model = _op_model("LookupU8", np.zeros(255, np.uint8), [(U8, [4])])
    with pytest.raises(Exception, match="table has 255 entries; it needs 256"):
        _session(model).run(None, {"in0": np.zeros(4, np.uint8)})


def _clamp_model(op: str, inputs: list[str], consts: dict, kind=U8, opset=17) -> onnx.ModelProto:
    """x (8-bit) -> op(inputs) -> y: a clamp of quantized values, as integer_form.py writes the
    Relu it moves after its Q (Max(q, zero point))."""
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]
    graph = helper.make_graph(
        [helper.make_node(op, inputs, ["y"], name="clamp")], "clamp",
        [helper.make_tensor_value_info("x", kind, [3, 2051])],
        [helper.make_tensor_value_info("y", kind, None)], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


BYTE_CLAMPS = {
    "relu moved after Q": ("Max", ["x", "z"], {"z": np.uint8(128)}, U8),
    "max of three": ("Max", ["x", "a", "b"], {"a": np.uint8(40), "b": np.uint8(200)}, U8),
    "min, int8": ("Min", ["x", "c"], {"c": np.int8(-7)}, I8),
    "clip, both bounds": (
        "Clip",
        ["x", "lo", "hi"],
        {"lo": np.uint8(128), "hi": np.uint8(171)},
        U8,
    ),
    "clip, high only, int8": ("Clip", ["x", "", "hi"], {"hi": np.int8(90)}, I8),
    "clip, low only": ("Clip", ["x", "lo"], {"lo": np.uint8(3)}, U8),
    "clip, low above high": (
        "Clip",
        ["x", "lo", "hi"],
        {"lo": np.int8(50), "hi": np.int8(-20)},
        I8,
    ),
}


@pytest.mark.parametrize("case", sorted(BYTE_CLAMPS))
def test_a_clamp_of_bytes_is_a_lookup_with_onnx_runtimes_numbers(case):
    op, inputs, consts, kind = BYTE_CLAMPS[case]
    model = _clamp_model(op, inputs, consts, kind)
    fused, count = _fused(model)
    assert count == 1
    assert [n.op_type for n in fused.graph.node] == [f"Lookup{'U8' if kind == U8 else 'I8'}"]
    assert not {i.name for i in fused.graph.initializer} & set(consts)  # the bounds are gone
    feed = {"x": _bytes([3, 2051], kind, 4)}
    want = _run(model, feed, False)
    got = _run(fused, feed, True)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_clamps_that_are_not_byte_tables_stay():
    from torch_fl.bpu.conversion.lookups import has_chains

    two_tensors = _clamp_model("Max", ["x", "x"], {})
    float_bound = _clamp_model("Max", ["x", "c"], {"c": np.float32(0.5)}, F)
    wide_bound = _clamp_model("Max", ["x", "c"], {"c": np.full(2051, 128, np.uint8)})
    rank_one = _clamp_model("Max", ["x", "c"], {"c": np.full(1, 128, np.uint8)})
    mixed = _clamp_model("Clip", ["x", "lo", "hi"], {"lo": np.uint8(1), "hi": np.int8(9)})
    no_bound = _clamp_model("Clip", ["x"], {})
    for model in (two_tensors, float_bound, wide_bound, rank_one, mixed, no_bound):
        assert _fused(model)[1] == 0
        assert not has_chains(model)
    # a bound computed at run time
    model = _clamp_model("Max", ["x", "z2"], {"z": np.uint8(128)})
    model.graph.node.insert(0, helper.make_node("Identity", ["z"], ["z2"]))
    assert _fused(model)[1] == 0
    assert has_chains(_clamp_model("Max", ["x", "z"], {"z": np.uint8(128)}))


def _clamp_table(lo: int, hi: int, signed: bool) -> np.ndarray:
    """The 256-byte table of min(max(b, lo), hi) over every byte b, compared as int8 where
    `signed`."""
    values = np.arange(256, dtype=np.uint8).view(np.int8 if signed else np.uint8).astype(int)
    return np.minimum(np.maximum(values, lo), hi).astype(np.int8 if signed else np.uint8)


CLAMP_TABLES = {
    "a relu at zero point 128": (128, 255, False),
    "a relu6 over uint8": (128, 171, False),
    "every byte (identity)": (0, 255, False),
    "one value": (77, 77, False),
    "below 128": (0, 127, False),
    "a relu over int8": (0, 127, True),
    "a relu6 over int8": (0, 43, True),
    "negative bounds, int8": (-128, -1, True),
    "across zero, int8": (-20, 90, True),
}


@pytest.mark.board
@pytest.mark.parametrize("case", sorted(CLAMP_TABLES))
def test_a_clamp_table_runs_as_a_max_and_a_min_in_every_form(case):
    """The op recognises a clamp's table and runs it without the table (clamp_bytes): both
    forms, in place and not, give the table's bytes at every length around the vector width."""
    table = _clamp_table(*CLAMP_TABLES[case]).view(np.uint8)
    rng = np.random.default_rng(len(case))
    for n in (0, 1, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1000, 4099):
        x = rng.integers(0, 256, n, dtype=np.uint8)
        want = table[x].tobytes()
        for portable in (False, True):
            for in_place in (False, True):
                got = _C._clamp_bytes(table.tobytes(), x.tobytes(), portable, in_place)
                assert got == want, (n, portable, in_place)


def test_a_table_that_is_no_clamp_is_looked_up():
    relu = _clamp_table(128, 255, False)
    off_by_one = relu.copy()
    off_by_one[200] = 201  # one byte differs
    low_above = relu.copy()
    low_above[0] = 129  # the bound at 0 is not the one elsewhere
    descending = np.arange(255, -1, -1, dtype=np.uint8)
    hardswish_like = np.clip(np.arange(256) * np.arange(256) // 300, 0, 255).astype(np.uint8)
    random = np.random.default_rng(0).integers(0, 256, 256, dtype=np.uint8)
    for table in (off_by_one, low_above, descending, hardswish_like, random):
        assert _C._clamp_bytes(table.tobytes(), bytes(range(256))) is None
    with pytest.raises(RuntimeError, match="256 bytes"):
        _C._clamp_bytes(bytes(255), b"")

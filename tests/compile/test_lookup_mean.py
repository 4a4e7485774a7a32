"""A float lookup and the ReduceMean over it as one op (conversion/lookup_mean.py,
csrc/runtime/ort_mean.cpp) against ONNX Runtime's own ReduceMean of the lookup, float for float,
in real sessions: squeeze-excitation shapes, a partial block of columns, rank 3, keepdims, int8
bytes, axes as an input (opset 18), batches of several items (ORT's groups-of-four order, where
this CPU's ORT adds so), both forms; tables whose sums depend on the order they are added in; what
must not be rewritten (a mean over the last axes of NCHW, a lookup read twice, one channel), the
op's refusal of any other reduction, and a compiled model."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tests.support.sim_ops import compiled_both_ways, op_session, random_input
from tests.support.zoo import ConvBnAct, InvertedResidual
from torch_fl.bpu.conversion.lookup_mean import (
    OP,
    fuse_means,
    groups_of_four_hold,
    reduce_shapes,
)
from torch_fl.bpu.conversion.lookups import DOMAIN

pytest.importorskip("onnxruntime")


def _table(seed: int) -> np.ndarray:
    """256 floats over many orders of magnitude, both signs: sums of them round differently in
    another order."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(256) * np.exp(rng.uniform(-9, 9, 256))).astype(np.float32)


def _pair(shape, axes, keepdims=1, x_type=TensorProto.UINT8, opset=17, seed=0) -> onnx.ModelProto:
    """x -> LookupF32 -> ReduceMean (named "mean") -> y."""
    inits = [numpy_helper.from_array(_table(seed), "table")]
    lookup = helper.make_node("LookupF32", ["table", "x"], ["f"], domain=DOMAIN, name="lookup")
    if opset >= 18:
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
        mean = helper.make_node("ReduceMean", ["f", "axes"], ["y"], name="mean", keepdims=keepdims)
    else:
        mean = helper.make_node(
            "ReduceMean", ["f"], ["y"], name="mean", axes=axes, keepdims=keepdims
        )
    graph = helper.make_graph(
        [lookup, mean], "pair",
        [helper.make_tensor_value_info("x", x_type, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets)


def _fused(model: onnx.ModelProto, shapes: dict, form: int = 0) -> tuple[onnx.ModelProto, int]:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy, fuse_means(copy, shapes, form)


def _original(shape, axes) -> dict:
    rank = len(shape)
    return {"mean": (list(shape), sorted(a + rank if a < 0 else a for a in axes))}


CASES = {
    # name: (shape, axes, keepdims, x type, opset)
    "14x14x240": ((1, 14, 14, 240), [1, 2], 1, TensorProto.UINT8, 17),
    "7x7x576": ((1, 7, 7, 576), [1, 2], 1, TensorProto.UINT8, 17),
    "56x56x16": ((1, 56, 56, 16), [1, 2], 1, TensorProto.UINT8, 17),
    "a partial block of columns": ((1, 5, 3, 83), [1, 2], 1, TensorProto.UINT8, 17),
    "rank 3, keepdims 0": ((1, 9, 40), [1], 0, TensorProto.UINT8, 17),
    "negative axes, int8": ((1, 6, 6, 24), [-3, -2], 1, TensorProto.INT8, 17),
    "axes as an input (opset 18)": ((1, 4, 4, 70), [1, 2], 0, TensorProto.UINT8, 18),
}
# several items before the reduced axes: ORT's groups of four (x86: conversion/lookup_mean.py)
BATCH_CASES = {
    "a batch of 8, 14x14x240": ((8, 14, 14, 240), [1, 2], 1, TensorProto.UINT8, 17),
    "a batch of 2, 7x7x576": ((2, 7, 7, 576), [1, 2], 1, TensorProto.UINT8, 17),
    "7 rows, a partial block of columns": ((3, 7, 1, 83), [1, 2], 1, TensorProto.UINT8, 17),
    "2 rows, int8, keepdims 0": ((5, 2, 1, 19), [1, 2], 0, TensorProto.INT8, 17),
    "rank 3, 13 rows": ((4, 13, 40), [1], 1, TensorProto.UINT8, 18),
}
grouped = pytest.mark.skipif(
    not groups_of_four_hold(), reason="this CPU's ONNX Runtime adds a batch's rows otherwise"
)


@pytest.mark.parametrize("form", [0, 1], ids=["fastest", "portable"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_op_is_onnx_runtimes_reducemean_float_for_float(case, form):
    shape, axes, keepdims, x_type, opset = CASES[case]
    model = _pair(shape, axes, keepdims, x_type, opset)
    fused, count = _fused(model, _original(shape, axes), form)
    assert count == 1
    assert [n.op_type for n in fused.graph.node] == [OP]
    x = random_input(np.random.default_rng(1), shape, x_type)
    expected = op_session(model).run(None, {"x": x})[0]
    got = op_session(fused).run(None, {"x": x})[0]
    assert got.shape == expected.shape and got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)


@grouped
@pytest.mark.parametrize("form", [0, 1], ids=["fastest", "portable"])
@pytest.mark.parametrize("case", sorted(BATCH_CASES))
def test_op_is_reducemean_float_for_float_over_a_batch(case, form):
    shape, axes, keepdims, x_type, opset = BATCH_CASES[case]
    model = _pair(shape, axes, keepdims, x_type, opset, seed=2)
    fused, count = _fused(model, _original(shape, axes), form)
    assert count == 1
    options = next(i for i in fused.graph.initializer if i.name.endswith("/options"))
    assert numpy_helper.to_array(options).tolist() == [keepdims, form, 1]
    x = random_input(np.random.default_rng(3), shape, x_type)
    expected = op_session(model).run(None, {"x": x})[0]
    for threads in (1, 3):
        assert op_session(fused, threads).run(None, {"x": x})[0].tobytes() == expected.tobytes()


def test_a_batchs_order_is_not_row_after_row():
    """The batch comparison above means something: ORT's means of a batch of two are not the
    row-after-row sums of the same floats (the batch-1 order), nor do they stay so per item."""
    shape = (2, 14, 14, 240)
    x = random_input(np.random.default_rng(1), shape, TensorProto.UINT8)
    expected = op_session(_pair(shape, [1, 2])).run(None, {"x": x})[0].reshape(2, -1)
    values = _table(0)[x.reshape(2, -1, shape[-1])]
    in_turn = np.zeros((2, shape[-1]), np.float32)
    for r in range(values.shape[1]):
        in_turn = (in_turn + values[:, r]).astype(np.float32)
    in_turn = (in_turn / np.float32(values.shape[1])).astype(np.float32)
    assert not np.array_equal(in_turn, expected)
    # and one item alone is row after row: the op must pick the order by the item count
    one = op_session(_pair((1, *shape[1:]), [1, 2])).run(None, {"x": x[:1]})[0]
    np.testing.assert_array_equal(one.reshape(-1), in_turn[0])


@pytest.mark.parametrize("shape", [(1, 4, 1, 3), (1, 5, 2, 3), (3, 6, 1, 5)])
def test_a_sum_of_negative_zeros_is_onnx_runtimes_zero(shape):
    """hardswish(x) is -0.0 below -3, so a table can hold -0.0: ORT's sums start from +0.0 (its
    means of -0.0s are +0.0), and so do the op's, in either order."""
    model = _pair(shape, [1, 2])
    table = next(i for i in model.graph.initializer if i.name == "table")
    table.CopyFrom(numpy_helper.from_array(np.full(256, -0.0, np.float32), "table"))
    fused, count = _fused(model, _original(shape, [1, 2]))
    assert count == (1 if shape[0] == 1 or groups_of_four_hold() else 0)
    x = np.zeros(shape, np.uint8)
    expected = op_session(model).run(None, {"x": x})[0]
    assert not np.signbit(expected).any()
    assert op_session(fused).run(None, {"x": x})[0].tobytes() == expected.tobytes()


def test_the_probe_finds_the_x86_order():
    """groups_of_four_hold is True on x86_64, whose ORT adds through MlasSgemmKernelM1Avx; where
    it is False a batch's pair stays two ORT nodes."""
    import platform

    if platform.machine() in ("x86_64", "AMD64"):
        assert groups_of_four_hold()
    shape = (2, 6, 6, 24)
    assert _fused(_pair(shape, [1, 2]), _original(shape, [1, 2]))[1] == int(groups_of_four_hold())


# ranges of 64 columns for the session's threads (ort_mean.cpp): 240 columns are four ranges, 576
# nine, 83 two (the second partial), 16 one; and a mean too small to split at all
SPLIT_CASES = [(1, 14, 14, 240), (1, 7, 7, 576), (1, 50, 3, 83), (1, 56, 56, 16), (1, 2, 2, 130)]


@pytest.mark.parametrize("form", [0, 1], ids=["fastest", "portable"])
@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("shape", SPLIT_CASES, ids=lambda s: "x".join(map(str, s[1:])))
def test_op_split_over_threads_is_reducemean_float_for_float(shape, threads, form):
    model = _pair(shape, [1, 2], seed=4)
    fused, count = _fused(model, _original(shape, [1, 2]), form)
    assert count == 1
    x = random_input(np.random.default_rng(5), shape, TensorProto.UINT8)
    expected = op_session(model).run(None, {"x": x})[0]
    got = op_session(fused, threads).run(None, {"x": x})[0]
    assert got.tobytes() == expected.tobytes()


def test_the_order_of_the_additions_matters_for_these_tables():
    """The comparison above means something: the same values added last row first give other
    floats."""
    shape = (1, 14, 14, 240)
    x = random_input(np.random.default_rng(1), shape, TensorProto.UINT8)
    expected = op_session(_pair(shape, [1, 2])).run(None, {"x": x})[0].reshape(-1)
    values = _table(0)[x.reshape(-1, shape[-1])]
    backwards = values[-1].copy()
    for row in values[-2::-1]:
        backwards = (backwards + row).astype(np.float32)
    backwards = (backwards / np.float32(values.shape[0])).astype(np.float32)
    assert not np.array_equal(backwards, expected)


def test_pairs_ort_adds_in_another_order_stay():
    # a batch of two with one output left: ORT reduces each item's rows as a vector sum
    assert _fused(_pair((2, 6, 6, 1), [1, 2]), _original((2, 6, 6, 1), [1, 2]))[1] == 0
    # the mean over the last axes of [1, C, H, W]: columns first
    assert _fused(_pair((1, 24, 6, 6), [2, 3]), _original((1, 24, 6, 6), [2, 3]))[1] == 0
    # one channel left: a reduction over everything
    assert _fused(_pair((1, 6, 6, 1), [1, 2]), _original((1, 6, 6, 1), [1, 2]))[1] == 0
    # no shape known for the node
    assert _fused(_pair((1, 6, 6, 24), [1, 2]), {})[1] == 0
    # the lookup's floats read by another node too
    model = _pair((1, 6, 6, 24), [1, 2])
    model.graph.output.append(helper.make_tensor_value_info("f", TensorProto.FLOAT, None))
    assert _fused(model, _original((1, 6, 6, 24), [1, 2]))[1] == 0


def test_a_channels_last_node_is_matched_to_its_nchw_original():
    """ORT moves a ReduceMean over H, W of [1, C, H, W] to axes 1, 2 of the NHWC tensor, keeping
    its name: the shape from the original graph is moved the same way."""
    shape = (1, 9, 9, 40)
    model = _pair(shape, [1, 2])
    fused, count = _fused(model, {"mean": ([1, 40, 9, 9], [2, 3])})
    assert count == 1
    x = random_input(np.random.default_rng(2), shape, TensorProto.UINT8)
    np.testing.assert_array_equal(
        op_session(fused).run(None, {"x": x})[0], op_session(model).run(None, {"x": x})[0]
    )
    # original axes that neither stay nor move to these under NCHW -> NHWC: left alone
    assert _fused(model, {"mean": ([1, 40, 9, 9], [1, 3])})[1] == 0


def test_reduce_shapes_reads_the_integer_graphs_inference():
    node = helper.make_node("ReduceMean", ["x"], ["y"], name="se", axes=[-1, -2], keepdims=1)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 24, 7, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    assert reduce_shapes(helper.make_model(graph)) == {"se": ([1, 24, 7, 5], [2, 3])}


def test_the_op_refuses_a_reduction_in_another_order():
    model = _pair((2, 6, 6, 24), [1, 2])
    fused, count = _fused(model, _original((1, 6, 6, 24), [1, 2]))  # a wrong shape, by hand
    assert count == 1
    x = random_input(np.random.default_rng(3), (2, 6, 6, 24), TensorProto.UINT8)
    with pytest.raises(Exception, match=r"LookupMeanF32: x \[2, 6, 6, 24\] is not reduced"):
        op_session(fused).run(None, {"x": x})
    options = next(i for i in fused.graph.initializer if i.name.endswith("/options"))
    options.CopyFrom(numpy_helper.from_array(np.array([1], np.int64), options.name))
    with pytest.raises(Exception, match="options two or three int64"):
        op_session(fused).run(None, {"x": x})
    # an order other than the two the op knows
    options.CopyFrom(numpy_helper.from_array(np.array([1, 0, 2], np.int64), options.name))
    with pytest.raises(Exception, match="order option must be 0 .* or 1 .*got 2"):
        op_session(fused).run(None, {"x": x})


def _excite_blocks() -> torch.nn.Module:
    """MobileNetV3-Small's stem and two of its squeeze-excitation blocks (tests/support/zoo.py)."""
    return torch.nn.Sequential(
        ConvBnAct(3, 16, 3, 2, act=torch.nn.Hardswish),
        InvertedResidual(16, 5, 96, 40, True, torch.nn.Hardswish, 2),
        InvertedResidual(40, 5, 120, 40, True, torch.nn.Hardswish, 1),
    )


def test_compiled_model_is_unchanged_by_the_op_and_explain_counts_it():
    torch.manual_seed(0)
    model = _excite_blocks().eval()
    x = torch.randn(1, 3, 36, 34)
    samples = [torch.randn(1, 3, 36, 34) for _ in range(3)]
    outs, runtimes, lines = compiled_both_ways(model, x, samples, "sim_lookups", "lookup means")
    sims = runtimes[True]
    assert sum(r._exec.lookup_means for r in sims) == 2
    assert sum(r._exec.lookup_means for r in runtimes[False]) == 0
    assert any("2 float lookups and the ReduceMean over each as one op" in s for s in lines[True])
    for a, b in zip(outs[True], outs[False], strict=True):
        assert torch.equal(a, b)


@pytest.mark.board
@pytest.mark.parametrize(
    "case", ["14x14x240", "a partial block of columns", "negative axes, int8", "a batch of 8"]
)
def test_op_matches_reducemean_on_this_cpu(case):
    """On the board (aarch64, its own ONNX Runtime, the plain loop) and any host: the op against
    that ONNX Runtime's own ReduceMean of the lookup; a batch's pair only where this CPU's ORT
    adds in groups of four (the probe ran here)."""
    if case == "a batch of 8":
        shape, axes, keepdims, x_type, opset = BATCH_CASES["a batch of 8, 14x14x240"]
        if not groups_of_four_hold():
            model = _pair(shape, axes, keepdims, x_type, opset)
            assert _fused(model, _original(shape, axes))[1] == 0
            return
    else:
        shape, axes, keepdims, x_type, opset = CASES[case]
    model = _pair(shape, axes, keepdims, x_type, opset, seed=5)
    fused, count = _fused(model, _original(shape, axes), form=1)
    assert count == 1
    x = random_input(np.random.default_rng(6), shape, x_type)
    np.testing.assert_array_equal(
        op_session(fused).run(None, {"x": x})[0], op_session(model).run(None, {"x": x})[0]
    )
    # split over two threads (column ranges of ORT's pool on the board): the same floats
    assert op_session(fused, 2).run(None, {"x": x})[0].tobytes() == (
        op_session(model).run(None, {"x": x})[0].tobytes()
    )

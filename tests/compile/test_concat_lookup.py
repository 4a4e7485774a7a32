"""The sim's 8-bit concat op with the lookups that feed it folded in
(csrc/runtime/ort_concat.cpp, torch_fl/bpu/conversion/concat_lookup.py): equal to ONNX
Runtime's QLinearConcat and the Lookup ops before it, byte for byte, in both forms and on two
threads; which lookups fold; which concats stay ORT's; bad input; a compiled model."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tests.support.sim_ops import NP, compiled_both_ways, op_session, random_input
from torch_fl.bpu.conversion.concat_lookup import candidates, requant_tables, rewrite_concats

ort = pytest.importorskip("onnxruntime")

DOMAIN = "torch_fl.bpu"
LOOKUP = {TensorProto.UINT8: "LookupU8", TensorProto.INT8: "LookupI8"}


def _concat_graph(
    shapes: list[list[int]],
    axis: int,
    kind: int = TensorProto.UINT8,
    looked_up: tuple[int, ...] = (),
    same_scale: tuple[int, ...] = (),
    seed: int = 0,
    extra_readers: tuple[int, ...] = (),
) -> onnx.ModelProto:
    """Inputs x0.. of `shapes` joined by a QLinearConcat along `axis`; the inputs in
    `looked_up` first pass through a Lookup of a random table (a clamp for input 0), those in
    `same_scale` have the output's scale and zero point, and the lookups of `extra_readers`
    are graph outputs too."""
    rng = np.random.default_rng(seed)
    np_kind = NP[kind]
    lo, hi = (0, 256) if kind == TensorProto.UINT8 else (-128, 128)
    inits = [
        numpy_helper.from_array(np.array(0.05, np.float32), "y_scale"),
        numpy_helper.from_array(np.array(rng.integers(lo + 60, hi - 60), np_kind), "y_zp"),
    ]
    nodes, names, outputs = [], ["y_scale", "y_zp"], []
    for i in range(len(shapes)):
        x = f"x{i}"
        if i in looked_up:
            every = np.arange(256, dtype=np.uint8).view(np_kind)
            table = np.maximum(every, np_kind(0)) if i == 0 else rng.integers(lo, hi, 256)
            inits.append(numpy_helper.from_array(np.asarray(table).astype(np_kind), f"t{i}"))
            nodes.append(helper.make_node(LOOKUP[kind], [f"t{i}", x], [f"l{i}"], domain=DOMAIN))
            x = f"l{i}"
            if i in extra_readers:
                outputs.append(helper.make_tensor_value_info(x, kind, None))
        if i in same_scale:
            scale, zp = 0.05, numpy_helper.to_array(inits[1])
        else:
            scale, zp = float(rng.uniform(0.01, 0.2)), rng.integers(lo, hi)
        inits += [
            numpy_helper.from_array(np.array(scale, np.float32), f"s{i}"),
            numpy_helper.from_array(np.array(zp, np_kind), f"z{i}"),
        ]
        names += [x, f"s{i}", f"z{i}"]
    nodes.append(helper.make_node("QLinearConcat", names, ["y"], axis=axis, domain="com.microsoft"))
    graph = helper.make_graph(
        nodes, "concat",
        [helper.make_tensor_value_info(f"x{i}", kind, s) for i, s in enumerate(shapes)],
        [helper.make_tensor_value_info("y", kind, None), *outputs], inits,
    )  # fmt: skip
    return helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", 17),
            helper.make_opsetid("com.microsoft", 1),
            helper.make_opsetid(DOMAIN, 1),
        ],
    )


def _feeds(shapes, kind, seed):
    rng = np.random.default_rng(seed)
    return {f"x{i}": random_input(rng, s, kind) for i, s in enumerate(shapes)}


def _same(model, shapes, kind, folded, threads=1) -> list[str]:
    """ORT's QLinearConcat (and lookups) against the rewritten graph in both forms, on two
    random inputs, every output byte for byte; returns the rewritten graph's op types."""
    ops = []
    for seed in range(2):
        feeds = _feeds(shapes, kind, seed)
        expected = op_session(model, threads).run(None, feeds)
        for form in (0, 1):
            rewritten = onnx.ModelProto()
            rewritten.CopyFrom(model)
            assert rewrite_concats(rewritten, form) == (1, folded)
            got = op_session(rewritten, threads).run(None, feeds)
            for e, g in zip(expected, got, strict=True):
                assert g.dtype == e.dtype and g.shape == e.shape
                np.testing.assert_array_equal(g, e)
            ops = [n.op_type for n in rewritten.graph.node]
    # the comparison means something: the output has many values, not one saturated one
    assert len(np.unique(expected[0])) > 20
    return ops


CASES = [
    # (shapes, axis, inputs looked up, inputs of the output's scale and zero point)
    ([[1, 28, 28, 64], [1, 28, 28, 128], [1, 28, 28, 32], [1, 28, 28, 32]], 3, (0, 1, 2, 3), ()),
    ([[2, 7, 9, 17], [2, 7, 9, 70], [2, 7, 9, 1]], -1, (0, 2), (1,)),  # tails, a 1-wide input
    ([[1, 16, 13, 13], [1, 48, 13, 13]], 1, (0, 1), (0,)),  # NCHW: long runs
    ([[3, 5], [2, 5], [4, 5]], 0, (1,), ()),  # the first axis: one row
    ([[2, 3, 200], [2, 3, 64]], 2, (), (0, 1)),  # no lookups, copies only
]


@pytest.mark.parametrize("kind", [TensorProto.UINT8, TensorProto.INT8], ids=["u8", "s8"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{len(c[0])}in-axis{c[1]}")
def test_op_equals_ort_concat_and_lookups_byte_for_byte(case, kind):
    shapes, axis, looked_up, same_scale = case
    model = _concat_graph(shapes, axis, kind, looked_up, same_scale)
    ops = _same(model, shapes, kind, folded=len(looked_up))
    assert ops == [{TensorProto.UINT8: "ConcatLookupU8", TensorProto.INT8: "ConcatLookupI8"}[kind]]


def test_op_on_two_threads():
    shapes = [[4, 30, 30, 24], [4, 30, 30, 40]]
    model = _concat_graph(shapes, 3, looked_up=(0, 1))
    _same(model, shapes, TensorProto.UINT8, folded=2, threads=2)


def test_a_lookup_something_else_reads_stays_and_still_counts():
    # l0 is a graph output too: it stays a Lookup, the concat reads it; l1 folds
    shapes = [[1, 5, 5, 8], [1, 5, 5, 8]]
    model = _concat_graph(shapes, 3, looked_up=(0, 1), extra_readers=(0,))
    ops = _same(model, shapes, TensorProto.UINT8, folded=1)
    assert sorted(ops) == ["ConcatLookupU8", "LookupU8"]


def test_a_concat_of_run_time_scales_stays_ort():
    shapes = [[1, 2, 2, 4], [1, 2, 2, 4]]
    model = _concat_graph(shapes, 3)
    model.graph.input.append(helper.make_tensor_value_info("dyn", TensorProto.FLOAT, []))
    concat = model.graph.node[-1]
    concat.input[3] = "dyn"  # x0's scale comes from the caller
    assert rewrite_concats(model) == (0, 0)
    assert [n.op_type for n in model.graph.node] == ["QLinearConcat"]


def test_tables_are_what_ort_writes_for_every_byte():
    # scale 0.1 -> 0.05 doubles each value about the zero points, saturating at the type's ends
    (table,) = requant_tables([(TensorProto.UINT8, (0.05, 100), [(0.1, 120), (0.05, 100)])])
    every = np.arange(256)
    np.testing.assert_array_equal(table[0], np.clip((every - 120) * 2 + 100, 0, 255))
    np.testing.assert_array_equal(table[1], every)  # alike: the identity


def test_candidates_count_the_integer_graphs_concats_of_dequantized_tensors():
    # before ORT's fusion: DequantizeLinear -> Concat -> QuantizeLinear is a candidate; a
    # concat of a float graph input with a dequantized tensor (a class token) is not
    inits = [
        numpy_helper.from_array(np.array(0.1, np.float32), "s"),
        numpy_helper.from_array(np.array(128, np.uint8), "z"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["a", "s", "z"], ["fa"]),
        helper.make_node("DequantizeLinear", ["b", "s", "z"], ["fb"]),
        helper.make_node("Concat", ["fa", "fb"], ["joined"], axis=1),
        helper.make_node("QuantizeLinear", ["joined", "s", "z"], ["q"]),
        helper.make_node("Concat", ["token", "fa"], ["y"], axis=1),
    ]
    graph = helper.make_graph(
        nodes, "integer",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 2]),
         helper.make_tensor_value_info("b", TensorProto.UINT8, [1, 3]),
         helper.make_tensor_value_info("token", TensorProto.FLOAT, [1, 1])],
        [helper.make_tensor_value_info("q", TensorProto.UINT8, None),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    assert candidates(helper.make_model(graph)) == 1


def _op_graph(tables: np.ndarray, geometry: list[int], shapes, kind=TensorProto.UINT8):
    inits = [
        numpy_helper.from_array(tables, "tables"),
        numpy_helper.from_array(np.array(geometry, np.int64), "g"),
    ]
    op = {TensorProto.UINT8: "ConcatLookupU8", TensorProto.INT8: "ConcatLookupI8"}[kind]
    names = [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node(op, ["tables", "g", *names], ["y"], domain=DOMAIN)
    graph = helper.make_graph(
        [node], "op",
        [helper.make_tensor_value_info(n, TensorProto.UINT8, s) for n, s in zip(names, shapes, strict=True)],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits,
    )  # fmt: skip
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]
    )


IDENTITY = np.arange(256, dtype=np.uint8)


@pytest.mark.parametrize(
    "tables, geometry, shapes, message",
    [
        (np.stack([IDENTITY]), [1, 0], [[1, 2], [1, 2]], r"\[2, 256\]"),
        (np.stack([IDENTITY] * 2)[:, :255], [1, 0], [[1, 2], [1, 2]], r"\[2, 256\]"),
        (np.stack([IDENTITY] * 2), [1], [[1, 2], [1, 2]], "2 int64"),
        (np.stack([IDENTITY] * 2), [1, 2], [[1, 2], [1, 2]], "form must be 0 or 1"),
        (np.stack([IDENTITY] * 2), [2, 0], [[1, 2], [1, 2]], "axis 2 is out of range"),
        (np.stack([IDENTITY] * 2), [-3, 0], [[1, 2], [1, 2]], "axis -3 is out of range"),
        (np.stack([IDENTITY] * 2), [1, 0], [[1, 2], [2, 2]], "does not join"),
        (np.stack([IDENTITY] * 2), [0, 0], [[1, 2], [1, 2, 1]], "does not join"),
    ],
    ids=[
        "too-few-tables",
        "short-table",
        "geometry",
        "form",
        "axis",
        "negative-axis",
        "other-size",
        "other-rank",
    ],  # fmt: skip
)
def test_bad_tables_geometry_or_inputs_are_refused_with_what_is_wrong(
    tables, geometry, shapes, message
):
    model = _op_graph(tables, geometry, shapes)
    feeds = {f"x{i}": np.zeros(s, np.uint8) for i, s in enumerate(shapes)}
    with pytest.raises(Exception, match=message):
        op_session(model).run(None, feeds)


def test_an_empty_input_joins_as_nothing():
    tables = np.stack([IDENTITY, IDENTITY[::-1].copy()])
    model = _op_graph(tables, [1, 0], [[2, 0], [2, 3]])
    x1 = np.arange(6, dtype=np.uint8).reshape(2, 3)
    (y,) = op_session(model).run(None, {"x0": np.zeros((2, 0), np.uint8), "x1": x1})
    np.testing.assert_array_equal(y, 255 - x1)


class _Inception(torch.nn.Module):
    """An inception block: four branches, each ending in a conv and a ReLU, joined along the
    channels."""

    def __init__(self) -> None:
        super().__init__()

        def branch(c_in, c_out, k):
            return torch.nn.Sequential(
                torch.nn.Conv2d(c_in, c_out, k, padding=k // 2), torch.nn.ReLU()
            )

        self.stem = branch(3, 16, 3)
        self.b1, self.b2, self.b3 = branch(16, 8, 1), branch(16, 12, 3), branch(16, 4, 5)
        self.pool = torch.nn.Sequential(torch.nn.MaxPool2d(3, 1, 1), branch(16, 8, 1))
        self.head = torch.nn.Conv2d(32, 8, 1)

    def forward(self, x):
        x = self.stem(x)
        return self.head(torch.cat([self.b1(x), self.b2(x), self.b3(x), self.pool(x)], 1))


def test_compiled_model_runs_the_op_and_explain_counts_it():
    torch.manual_seed(0)
    model = _Inception().eval()
    x = torch.randn(2, 3, 32, 32)
    samples = [torch.randn(2, 3, 32, 32) for _ in range(3)]
    outs, runtimes, lines = compiled_both_ways(model, x, samples, "sim_lookups", "concat")
    assert sum(r._exec.concats for r in runtimes[True]) == 1
    assert sum(r._exec.concats for r in runtimes[False]) == 0
    assert len(lines[True]) == 1 and not lines[False]
    assert "1 8-bit concat on the extension's op" in lines[True][0]
    for a, b in zip(outs[True], outs[False], strict=True):
        assert torch.equal(a, b)

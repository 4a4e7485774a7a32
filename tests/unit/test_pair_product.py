"""Two-input tables that are products (conversion/pair_product.py, `Lookup2MulU8` / `I8` in
csrc/runtime/ort_lookup.cpp): the form is taken only where all 65536 results equal the table,
and the op gives the table's bytes, in the NHWC per-channel shapes its fast form runs and in
every other broadcast, on 1 to 3 threads; bad inputs are refused by name."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from tests.unit.test_lookups import (
    I8,
    U8,
    _bytes,
    _fused,
    _model,
    _op_model,
    _run,
    _threaded_session,
)
from torch_fl import _C
from torch_fl.bpu.conversion.pair_product import fit


def _gate(act: str, gate: str, first: str = "x"):
    """A squeeze-excitation scale: act(x) * gate(s)."""
    nodes, factor = [], "a"
    if act == "hardswish":
        nodes.append(helper.make_node("HardSwish", ["x_f"], ["a"]))
    elif act == "silu_sig":
        nodes.append(helper.make_node("Sigmoid", ["x_f"], ["a_sig"]))
        nodes.append(helper.make_node("Mul", ["x_f", "a_sig"], ["a"]))
    else:  # the dequantized input itself is the factor
        factor = "x_f"
    gates = {
        "hardsigmoid": helper.make_node("HardSigmoid", ["s_f"], ["g"], alpha=1 / 6, beta=0.5),
        "sigmoid": helper.make_node("Sigmoid", ["s_f"], ["g"]),
    }
    nodes.append(gates[gate])
    nodes.append(helper.make_node("Mul", [factor, "g"] if first == "x" else ["g", factor], ["y_f"]))
    return nodes


CHAINS = [
    # (activation, gate, output type, x zero point, s zero point, Mul operand order)
    ("hardswish", "hardsigmoid", U8, 3, 120, "x"),
    ("silu_sig", "sigmoid", U8, 128, 100, "s"),
    ("none", "hardsigmoid", I8, 0, -5, "x"),
    ("silu_sig", "sigmoid", I8, -20, 7, "x"),
    ("none", "hardsigmoid", U8, 0, 120, "x"),  # MobileNetV3's: a Relu's bytes, zero point 0
    ("none", "sigmoid", U8, 131, 100, "s"),
    ("none", "sigmoid", I8, -20, 7, "s"),
]


@pytest.mark.parametrize("chain", CHAINS, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize(
    "x_shape,s_shape",
    [
        ([2, 9, 11, 40], [2, 1, 1, 40]),  # NHWC: the product kernel (AVX512-VBMI here)
        ([1, 57, 57, 16], [1, 1, 1, 16]),  # 16 channels: 64-wide steps across rows
        ([3, 5, 7, 100], [3, 1, 1, 100]),  # a partial last step
        ([2, 40, 9, 11], [2, 40, 1, 1]),  # NCHW: one table row per plane
    ],
)
def test_a_gate_is_a_product_with_the_float_paths_numbers(chain, x_shape, s_shape):
    act, gate, out_type, zx, zs, first = chain
    x_type = U8 if zx >= 0 and out_type == U8 else I8
    s_type = U8 if zs >= 0 and out_type == U8 else I8
    model = _model(
        _gate(act, gate, first),
        [("x", x_type, x_shape, 0.05, zx), ("s", s_type, s_shape, 0.09, zs)],
        out_type,
        out_shape=x_shape,
    )
    fused, count = _fused(model)
    assert count == 1
    (node,) = [n for n in fused.graph.node if n.op_type.startswith("Lookup")]
    assert node.op_type == ("Lookup2MulU8" if out_type == U8 else "Lookup2MulI8")
    feed = {"x": _bytes(x_shape, x_type, 4), "s": _bytes(s_shape, s_type, 5)}
    affine_runs = _C._affine_products()
    np.testing.assert_array_equal(_run(fused, feed, True), _run(model, feed, False))
    # the AVX2 form computes a dequantized operand's floats instead of gathering its table's
    # (csrc/runtime/ort_lookup.cpp affine_table): only there, and only in the NHWC shapes
    nhwc = s_shape[1:3] == [1, 1] and s_shape[3] > 1
    computed = _C._lookup_kernel() == "avx2" and nhwc and act == "none"
    assert (_C._affine_products() > affine_runs) == computed


def _dequantize(signed: bool, zp: int, scale: float) -> np.ndarray:
    """ORT's DequantizeLinear of every byte (as uint8, or as int8): float32(v - zp) * scale."""
    values = np.arange(256, dtype=np.uint8)
    ints = values.view(np.int8).astype(np.int32) if signed else values.astype(np.int32)
    return (ints - zp).astype(np.float32) * np.float32(scale)


@pytest.mark.parametrize(
    "signed,zp,scale", [(False, 0, 0.05), (False, 255, 0.3), (False, 131, 1e-9), (True, -128, 2.5),
                        (True, 127, 0.01), (True, -20, 0.1)],
)  # fmt: skip
def test_a_dequantize_table_is_found_with_its_scale_and_zero_point(signed, zp, scale):
    found = _C._dequant_of(_dequantize(signed, zp, scale).tobytes(), signed)
    assert found is not None
    assert found[1] == zp and np.float32(found[0]) == np.float32(scale)


def test_tables_that_are_not_exactly_a_dequantize_are_refused():
    table = _dequantize(False, 3, 0.05)
    # read as the other byte type: no zero point makes it one
    assert _C._dequant_of(table.tobytes(), True) is None
    # one entry one unit in the last place off
    off = table.copy()
    off[200] = np.nextafter(off[200], np.float32(np.inf))
    assert _C._dequant_of(off.tobytes()) is None
    # the zero as -0.0: a different float, so not this form (the gather keeps its sign)
    negative = table.copy()
    negative[3] = np.float32(-0.0)
    assert _C._dequant_of(negative.tobytes()) is None
    # a scale of 0 (every entry zero) and a nonlinear table
    assert _C._dequant_of(np.zeros(256, np.float32).tobytes()) is None
    assert _C._dequant_of(np.tanh(table).astype(np.float32).tobytes()) is None
    with pytest.raises(ValueError, match="256 float32s"):
        _C._dequant_of(table[:255].tobytes())


def test_a_sum_of_two_inputs_is_no_product():
    nodes = [
        helper.make_node("Sigmoid", ["s_f"], ["g"]),
        helper.make_node("Add", ["x_f", "g"], ["t"]),
        helper.make_node("Relu", ["t"], ["y_f"]),
    ]
    model = _model(nodes, [("x", U8, [2, 5, 5, 8], 0.05, 128), ("s", U8, [2, 1, 1, 8], 0.1, 128)])
    fused, count = _fused(model)
    assert count == 1 and [n.op_type for n in fused.graph.node] == ["Lookup2U8"]


def test_a_product_inside_a_longer_chain_is_no_product():
    """The Mul must be the quantize's own input: a Relu after it makes the table no product."""
    nodes = [
        helper.make_node("Sigmoid", ["s_f"], ["g"]),
        helper.make_node("Mul", ["x_f", "g"], ["t"]),
        helper.make_node("Sub", ["t", "c"], ["u"]),
        helper.make_node("Relu", ["u"], ["y_f"]),
    ]
    c = helper.make_tensor("c", 1, [], [0.3])
    model = _model(
        nodes,
        [("x", U8, [2, 5, 5, 8], 0.05, 128), ("s", U8, [2, 1, 1, 8], 0.1, 128)],
        extra_inits=[c],
    )
    fused, count = _fused(model)
    assert count == 1 and [n.op_type for n in fused.graph.node] == ["Lookup2U8"]


def _random_product(rng, signed: bool):
    a = rng.uniform(-4, 4, 256).astype(np.float32)
    b = rng.uniform(0, 1, 256).astype(np.float32)
    scale, zp = np.float32(0.03), (-3 if signed else 131)
    lo, hi = (-128, 127) if signed else (0, 255)
    product = a[:, None] * b[None, :]
    q = np.rint(np.clip(product / scale, lo - zp, hi - zp)).astype(np.int32) + zp
    table = q.astype(np.int8 if signed else np.uint8).reshape(-1)
    return a, b, scale, zp, table, product


def test_fit_takes_an_exact_product_and_refuses_one_wrong_byte():
    rng = np.random.default_rng(0)
    a, b, scale, zp, table, product = _random_product(rng, signed=False)
    first = np.broadcast_to(a[:, None], (256, 256)).reshape(-1)
    second = np.broadcast_to(b[None, :], (256, 256)).reshape(-1)
    found = fit(first, second, table, float(scale), zp, signed=False)
    assert found is not None and found.quant[2] == 1.0  # divided by the scale, as ORT does
    np.testing.assert_array_equal(found.a_floats, a)
    np.testing.assert_array_equal(found.b_floats, b)
    # the factors in the other order: the same form
    swapped = fit(second, first, table, float(scale), zp, signed=False)
    assert swapped is not None
    np.testing.assert_array_equal(swapped.a_floats, a)
    # one byte of the table off: no form
    wrong = table.copy()
    wrong[12345] ^= 1
    assert fit(first, second, wrong, float(scale), zp, signed=False) is None
    # a factor that depends on both inputs: no form
    mixed = first.copy()
    mixed[300] += 1.0
    assert fit(mixed, second, table, float(scale), zp, signed=False) is None
    # a factor that is not finite: no form
    infinite = first.copy()
    infinite[: 256 * 2] = np.inf
    assert fit(infinite, second, table, float(scale), zp, signed=False) is None


def _product_op(rng, signed: bool):
    a, b, scale, zp, table, _ = _random_product(rng, signed)
    kind = I8 if signed else U8
    quant = np.array([scale, zp, 1.0], np.float32)
    return table, a, b, quant, kind


def _op(kind, table, a_floats, b_floats, quant, a_shape, b_shape):
    from onnx import numpy_helper

    op = "Lookup2MulI8" if kind == I8 else "Lookup2MulU8"
    model = _op_model(op, table, [(U8, a_shape), (U8, b_shape)])
    extra = [("fa", a_floats), ("fb", b_floats), ("q", quant)]
    model.graph.node[0].input.extend(n for n, _ in extra)
    model.graph.initializer.extend(numpy_helper.from_array(v, n) for n, v in extra)
    if kind == I8:
        model.graph.output[0].type.tensor_type.elem_type = I8
    return model


PAIR_SHAPES = [
    ([2, 57, 57, 24], [2, 1, 1, 24]),  # per-channel scale in NHWC, the scale second
    ([3, 1, 1, 40], [3, 9, 7, 40]),  # the scale first
    ([2, 61, 67, 5], [2, 1, 1, 5]),  # fewer channels than a step
    ([1, 1, 1, 13], [1, 150, 130, 13]),  # pixels split over pieces
    ([3, 16, 111, 113], [3, 16, 1, 1]),  # NCHW: the table
    ([64, 1, 4099], [1, 37, 1]),  # neither runs along the other's rows: the table
]


@pytest.mark.parametrize("signed", [False, True], ids=["u8", "s8"])
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("a_shape,b_shape", PAIR_SHAPES)
def test_the_op_gives_its_tables_bytes(signed, threads, a_shape, b_shape):
    rng = np.random.default_rng(11)
    table, fa, fb, quant, kind = _product_op(rng, signed)
    model = _op(kind, table, fa, fb, quant, a_shape, b_shape)
    a, b = _bytes(a_shape, U8, 1), _bytes(b_shape, U8, 2)
    want = table[256 * a.astype(np.int64) + b]
    got = _threaded_session(model, threads).run(None, {"in0": a, "in1": b})[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "what,arrays,message",
    [
        ("a short float table", (np.zeros(255, np.float32), None, None), "256 floats"),
        ("integer floats", (np.zeros(256, np.int32), None, None), r"tensor\(int32\)"),
        ("no quantization", (None, None, np.zeros(2, np.float32)), "3 floats"),
        ("a zero scale", (None, None, np.array([0, 0, 1], np.float32)), "positive scale"),
        ("a zero point out of range", (None, None, np.array([1, 300, 1], np.float32)), "range"),
        ("a fractional zero point", (None, None, np.array([1, 2.5, 1], np.float32)), "integer"),
        ("a divide flag of 2", (None, None, np.array([1, 0, 2], np.float32)), "0 or 1"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_bad_product_inputs_are_refused_by_name(what, arrays, message):
    rng = np.random.default_rng(1)
    table, fa, fb, quant, kind = _product_op(rng, False)
    fa, fb, quant = (
        new if new is not None else old for new, old in zip(arrays, (fa, fb, quant), strict=True)
    )
    model = _op(kind, table, fa, fb, quant, [1, 1, 1, 8], [1, 4, 4, 8])
    options = ort.SessionOptions()
    options.log_severity_level = 3
    from torch_fl.bpu.runtime.executors import lookup_library

    options.register_custom_ops_library(lookup_library())
    with pytest.raises(Exception, match=message):
        session = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
        session.run(
            None, {"in0": np.zeros([1, 1, 1, 8], np.uint8), "in1": np.zeros([1, 4, 4, 8], np.uint8)}
        )

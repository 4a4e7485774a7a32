"""What the tests of the sim's own ONNX Runtime conv ops share (tests/compile/test_depthwise.py,
test_narrow_op.py): a one-node QLinearConv graph, sessions that load the extension's ops, random
8-bit inputs, the op against ORT's own node, and a compiled model run with the op's option on
and off."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

NP = {TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8}
"""numpy's type for each 8-bit ONNX element type."""


def conv_graph(nodes: list, inits: list, shape, x_type: int) -> onnx.ModelProto:
    """A model of `nodes` from input "x" (of `shape` and `x_type`) to output "y"."""
    graph = helper.make_graph(
        nodes, "conv",
        [helper.make_tensor_value_info("x", x_type, list(shape))],
        [helper.make_tensor_value_info("y", x_type, None)], inits,
    )  # fmt: skip
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )


def depthwise_qlinearconv(
    rng: np.random.Generator,
    shape: tuple[int, int, int, int],
    kernel: tuple[int, int],
    strides=(1, 1),
    dilations=(1, 1),
    pads=(1, 1, 1, 1),
    x_type=TensorProto.UINT8,
    zp_x=128,
    zp_y=100,
    w_type=TensorProto.INT8,
    per_channel=True,
    bias=True,
    bias_scale=300,
) -> onnx.ModelProto:
    """One channels-last depthwise QLinearConv (com.microsoft, as ORT's optimizer writes it)
    over an NHWC input of `shape` with random weights, scales and bias."""
    n, h, w, c = shape
    kh, kw = kernel
    if w_type == TensorProto.INT8:
        weights, w_zp = rng.integers(-127, 128, (c, 1, kh, kw)).astype(np.int8), np.int8(0)
    else:
        weights, w_zp = rng.integers(0, 256, (c, 1, kh, kw)).astype(np.uint8), np.uint8(128)
    w_scale = rng.uniform(0.001, 0.02, c if per_channel else 1).astype(np.float32)
    inits = [
        numpy_helper.from_array(np.array(rng.uniform(0.005, 0.05), np.float32), "xs"),
        numpy_helper.from_array(np.array(zp_x, NP[x_type]), "xz"),
        numpy_helper.from_array(weights, "w"),
        numpy_helper.from_array(w_scale if per_channel else w_scale.reshape(()), "ws"),
        numpy_helper.from_array(np.full(c, w_zp) if per_channel else np.array(w_zp), "wz"),
        numpy_helper.from_array(np.array(rng.uniform(0.002, 0.03), np.float32), "ys"),
        numpy_helper.from_array(np.array(zp_y, NP[x_type]), "yz"),
    ]
    inputs = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"]
    if bias:
        b = rng.integers(-bias_scale, bias_scale + 1, c).astype(np.int32)
        inits.append(numpy_helper.from_array(b, "b"))
        inputs.append("b")
    node = helper.make_node(
        "QLinearConv", inputs, ["y"], domain="com.microsoft", name="dw",
        group=c, kernel_shape=list(kernel), strides=list(strides), dilations=list(dilations),
        pads=list(pads), channels_last=1,
    )  # fmt: skip
    return conv_graph([node], inits, shape, x_type)


def narrow_qlinearconv(
    rng: np.random.Generator,
    shape: tuple[int, int, int, int],
    outputs: int,
    kernel: tuple[int, int],
    strides=(1, 1),
    dilations=(1, 1),
    pads=(1, 1, 1, 1),
    x_type=TensorProto.UINT8,
    zp_x=128,
    zp_y=100,
    w_type=TensorProto.INT8,
    per_channel=True,
    bias=True,
    bias_scale=3000,
    nchw=False,
) -> onnx.ModelProto:
    """One channels-last QLinearConv (com.microsoft, as ORT's optimizer writes it) over an input
    of `shape` (NHWC; with `nchw`, an NCHW input and the Transpose ORT puts before such a conv)
    with random weights, scales and bias."""
    if nchw:
        n, c, h, w = shape
    else:
        n, h, w, c = shape
    kh, kw = kernel
    if w_type == TensorProto.INT8:
        weights, w_zp = rng.integers(-127, 128, (outputs, c, kh, kw)).astype(np.int8), np.int8(0)
    else:
        weights, w_zp = rng.integers(0, 256, (outputs, c, kh, kw)).astype(np.uint8), np.uint8(128)
    w_scale = rng.uniform(0.0005, 0.01, outputs if per_channel else 1).astype(np.float32)
    inits = [
        numpy_helper.from_array(np.array(rng.uniform(0.005, 0.05), np.float32), "xs"),
        numpy_helper.from_array(np.array(zp_x, NP[x_type]), "xz"),
        numpy_helper.from_array(weights, "w"),
        numpy_helper.from_array(w_scale if per_channel else w_scale.reshape(()), "ws"),
        numpy_helper.from_array(np.full(outputs, w_zp) if per_channel else np.array(w_zp), "wz"),
        numpy_helper.from_array(np.array(rng.uniform(0.01, 0.1), np.float32), "ys"),
        numpy_helper.from_array(np.array(zp_y, NP[x_type]), "yz"),
    ]
    source = "x_nhwc" if nchw else "x"
    inputs = [source, "xs", "xz", "w", "ws", "wz", "ys", "yz"]
    if bias:
        b = rng.integers(-bias_scale, bias_scale + 1, outputs).astype(np.int32)
        inits.append(numpy_helper.from_array(b, "b"))
        inputs.append("b")
    nodes = [helper.make_node("Transpose", ["x"], ["x_nhwc"], perm=[0, 2, 3, 1])] if nchw else []
    nodes.append(
        helper.make_node(
            "QLinearConv", inputs, ["y"], domain="com.microsoft", name="conv",
            kernel_shape=list(kernel), strides=list(strides), dilations=list(dilations),
            pads=list(pads), channels_last=1,
        )
    )  # fmt: skip
    return conv_graph(nodes, inits, shape, x_type)


def qgemm(
    rng: np.random.Generator,
    k: int,
    n: int,
    a_type=TensorProto.UINT8,
    zp_a=128,
    float_out=True,
    zp_y=100,
    alpha=1.0,
    trans_b=True,
    per_column=True,
    bias=True,
    bias_scale=5000,
    rows=1,
    w_type=TensorProto.INT8,
) -> onnx.ModelProto:
    """One QGemm (com.microsoft, as ORT's optimizer writes it) from x [rows, k] with random
    weights, scales and bias: int8 weights (zero point 0), or with `w_type` UINT8 the same
    integers plus 128 (zero point 128: ORT's u8u8 kernels, as the sim's `mixed` path writes)."""
    b = rng.integers(-127, 128, (n, k) if trans_b else (k, n)).astype(np.int8)
    zero = np.int8(0)
    if w_type == TensorProto.UINT8:
        b, zero = (b.astype(np.int16) + 128).astype(np.uint8), np.uint8(128)
    b_scale = rng.uniform(0.001, 0.02, n if per_column else 1).astype(np.float32)
    a_scale = np.float32(rng.uniform(0.005, 0.05))
    # y's scale puts the outputs some 40 steps either side of its zero point
    y_scale = np.float32(a_scale * b_scale.mean() * np.sqrt(k) * 80 * 73 / 40)
    inits = [
        numpy_helper.from_array(np.array(a_scale, np.float32), "as"),
        numpy_helper.from_array(np.array(zp_a, NP[a_type]), "az"),
        numpy_helper.from_array(b, "b"),
        numpy_helper.from_array(b_scale if per_column else b_scale.reshape(()), "bs"),
        numpy_helper.from_array(np.full(n, zero) if per_column else np.array(zero), "bz"),
    ]
    inputs = ["x", "as", "az", "b", "bs", "bz"]
    if bias:
        c = rng.integers(-bias_scale, bias_scale + 1, n).astype(np.int32)
        inits.append(numpy_helper.from_array(c, "c"))
    inputs.append("c" if bias else "")
    if not float_out:
        inits.append(numpy_helper.from_array(np.array(y_scale, np.float32), "ys"))
        inits.append(numpy_helper.from_array(np.array(zp_y, NP[a_type]), "yz"))
        inputs += ["ys", "yz"]
    node = helper.make_node(
        "QGemm", inputs, ["y"], domain="com.microsoft", name="fc", alpha=alpha,
        transB=int(trans_b),
    )  # fmt: skip
    y_type = TensorProto.FLOAT if float_out else a_type
    graph = helper.make_graph(
        [node], "gemm",
        [helper.make_tensor_value_info("x", a_type, [rows, k])],
        [helper.make_tensor_value_info("y", y_type, None)], inits,
    )  # fmt: skip
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )


def op_session(model: onnx.ModelProto, threads: int = 1):
    """A session of `model` as it stands (no ORT optimization) with the extension's ops."""
    import onnxruntime as ort

    from torch_fl import _C

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    options.register_custom_ops_library(_C.__file__)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])


def random_input(rng: np.random.Generator, shape, x_type: int) -> np.ndarray:
    lo, hi = (0, 256) if x_type == TensorProto.UINT8 else (-128, 128)
    return rng.integers(lo, hi, shape).astype(NP[x_type])


def exact_reference(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model`, or where this CPU's ORT u8s8 kernels add pairs in saturating int16 (no VNNI:
    runtime/sim_kernels.py) a copy whose QLinearConvs, QGemms and QLinearMatMuls over uint8
    inputs hold their int8 weights as uint8 with 128 added to weights and zero points: the same
    integers w - zp, through ORT's u8u8 kernels, which are exact on every CPU. (Its int8-input
    ones are exact either way.) Each of those ops holds x's zero point, the weights and their
    zero points as inputs 2, 3 and 5."""
    from torch_fl.bpu.runtime import sim_kernels

    if sim_kernels.probe("u8s8") is None:
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    inits = {i.name: i for i in copy.graph.initializer}
    for node in copy.graph.node:
        ops = ("QLinearConv", "QGemm", "QLinearMatMul")
        x_zero = inits.get(node.input[2]) if node.op_type in ops else None
        if x_zero is None or x_zero.data_type != TensorProto.UINT8:  # x's type is its zero's
            continue
        for name in (node.input[3], node.input[5]):  # weights, weight zero points
            init = inits[name]
            if init.data_type == TensorProto.INT8:
                shifted = numpy_helper.to_array(init).astype(np.int16) + 128
                init.CopyFrom(numpy_helper.from_array(shifted.astype(np.uint8), name))
    return copy


def both(
    model: onnx.ModelProto, x: np.ndarray, rewrite: Callable[[onnx.ModelProto], int], threads=1
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(ORT's output for `model` (`exact_reference`), the output once `rewrite` replaced its one
    node, the rewritten graph's op types)."""
    expected = op_session(exact_reference(model), threads).run(None, {"x": x})[0]
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert rewrite(rewritten) == 1
    got = op_session(rewritten, threads).run(None, {"x": x})[0]
    return expected, got, [n.op_type for n in rewritten.graph.node]


def assert_same_bytes(
    model: onnx.ModelProto, shape, rewrite: Callable[[onnx.ModelProto], int], op: str
) -> None:
    """On three random uint8 inputs, `model` rewritten to the one node `op` gives ORT's output
    for `model` byte for byte, in its dtype and shape, and that output is not trivially
    saturated (so the comparison means something)."""
    for seed in range(3):
        x = random_input(np.random.default_rng(seed), shape, TensorProto.UINT8)
        expected, got, ops = both(model, x, rewrite)
        assert ops == [op]
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)
    assert len(np.unique(expected)) > min(20, expected.size // 4)


def compiled_both_ways(
    model: torch.nn.Module,
    x: torch.Tensor | list[tuple],
    samples: list,
    option: str,
    word: str,
) -> tuple[dict, dict, dict]:
    """(outputs, sim runtimes, explain() lines naming `word`), each keyed by the option's value:
    the model compiled with executor="sim" and `option` True and False, calibrated on `samples`,
    then run on `x` at three scales, or on each input tuple of a list `x` (token ids, which no
    scale keeps in range)."""
    from torch_fl import bpu
    from torch_fl.bpu import report

    runs = [(x * scale,) for scale in (1.0, 3.0, 0.2)] if isinstance(x, torch.Tensor) else x
    outs, runtimes, lines = {}, {}, {}
    for value in (True, False):
        torch._dynamo.reset()
        options = {"executor": "sim", option: value, "cache": False}
        compiled = torch.compile(model, backend="bpu", options=options)
        with report.collect() as reps, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            bpu.calibrate(compiled, samples)
            with torch.no_grad():
                outs[value] = [compiled(*args) for args in runs]
        runtimes[value] = [r for g in reps for r in g.runtimes if r.kind == "sim"]
        if runtimes[value][0]._exec.kernels.path == "float":
            pytest.skip(f"no fused kernel path on this CPU: the float path has no {word!r} op")
        table = report.Report(reps).table()
        lines[value] = [line for line in table.splitlines() if word in line]
    return outs, runtimes, lines


def assert_moved_and_unchanged(
    model: torch.nn.Module,
    option: str,
    word: str,
    counter: str,
    moved: int,
    phrase: str,
    forms: tuple[str, ...] = ("avx512",),
) -> None:
    """`model` compiled with `option` on and off (`compiled_both_ways`, on a 2x3x32x32 input):
    on, where the extension's conv ops run one of `forms` here (`_C._depthwise_kernel()`), the
    sims' executors count `moved` nodes in `counter` and explain() has one line naming `word`
    with `phrase`; off, none; the outputs equal bit for bit either way."""
    from torch_fl import _C

    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32)
    samples = [torch.randn(2, 3, 32, 32) for _ in range(3)]
    outs, runtimes, lines = compiled_both_ways(model, x, samples, option, word)
    fast = _C._depthwise_kernel() in forms
    assert sum(getattr(r._exec, counter) for r in runtimes[True]) == (moved if fast else 0)
    assert sum(getattr(r._exec, counter) for r in runtimes[False]) == 0
    assert len(lines[True]) == (1 if fast else 0) and not lines[False]
    if fast:
        assert phrase in lines[True][0]
    for a, b in zip(outs[True], outs[False], strict=True):
        assert torch.equal(a, b)

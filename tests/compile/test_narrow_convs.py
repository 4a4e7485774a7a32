"""Narrow integer convs as exact float convs (conversion/narrow_convs.py): the rewritten graph and
ONNX Runtime's fused QLinearConv give the same bytes, on every integer path, and only the convs
whose float form is exact and measured faster are rewritten."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from tests.compile.bpu_helpers import compile_bpu, runtimes
from torch_fl.bpu import report
from torch_fl.bpu.conversion import narrow_convs
from torch_fl.bpu.conversion.integer_form import to_integer_form
from torch_fl.bpu.runtime.executors import UNFUSED, fused_graph


def _session(model: onnx.ModelProto, threads: int = 1) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    return ort.InferenceSession(
        model.SerializeToString(), options, ["CPUExecutionProvider"],
        disabled_optimizers=list(UNFUSED),
    )  # fmt: skip


def _conv_graph(
    cin: int = 3, cout: int = 16, k: int = 3, stride: int = 2, group: int = 1, seed: int = 0,
    x_zero: int = 128, w_dtype=np.int8, bias_max: int = 20000, hw: int = 33, y_mul: float = 1.0,
) -> onnx.ModelProto:  # fmt: skip
    """Q -> DQ -> Conv (DQ'd per-channel weights, int32 bias) -> Q -> DQ -> Relu -> Q: the shape
    of a quantized stem as the integer form leaves it."""
    rng = np.random.RandomState(seed)
    if w_dtype == np.int8:
        w = rng.randint(-127, 128, (cout, cin // group, k, k)).astype(np.int8)
        w_zero = np.zeros(cout, np.int8)
    else:  # the u8u8 form: weights + 128 with zero point 128
        w = rng.randint(1, 256, (cout, cin // group, k, k)).astype(np.uint8)
        w_zero = np.full(cout, 128, np.uint8)
    x_scale = np.float32(rng.uniform(0.005, 0.1))
    w_scale = rng.uniform(0.0005, 0.02, cout).astype(np.float32)
    bias = rng.randint(-bias_max, bias_max + 1, cout).astype(np.int32)
    y_scale = np.float32(rng.uniform(0.01, 0.3) * y_mul)
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(w_zero, "w_zero"),
        numpy_helper.from_array(w_scale, "w_scale"),
        numpy_helper.from_array(bias, "b"),
        numpy_helper.from_array(x_scale * w_scale, "b_scale"),
        numpy_helper.from_array(np.zeros(cout, np.int32), "b_zero"),
        numpy_helper.from_array(np.array(x_scale), "x_scale"),
        numpy_helper.from_array(np.array(x_zero, np.uint8), "x_zero"),
        numpy_helper.from_array(np.array(y_scale), "y_scale"),
        numpy_helper.from_array(np.array(128, np.uint8), "y_zero"),
    ]
    pads = [k // 2] * 4
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zero"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "w_scale", "w_zero"], ["wd"], axis=0),
        helper.make_node("DequantizeLinear", ["b", "b_scale", "b_zero"], ["bd"], axis=0),
        helper.make_node(
            "Conv",
            ["xd", "wd", "bd"],
            ["y"],
            kernel_shape=[k, k],
            strides=[stride, stride],
            pads=pads,
            group=group,
        ),  # fmt: skip
        helper.make_node("QuantizeLinear", ["y", "y_scale", "y_zero"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "y_scale", "y_zero"], ["yd"]),
        helper.make_node("Relu", ["yd"], ["r"]),
        helper.make_node("QuantizeLinear", ["r", "y_scale", "y_zero"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes, "narrow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, cin, hw, hw])],
        [helper.make_tensor_value_info("out", TensorProto.UINT8, None),
         helper.make_tensor_value_info("yq", TensorProto.UINT8, None)], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _rewritten(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy, narrow_convs.rewrite_narrow_convs(copy)


def _inputs(cin: int, hw: int, seed: int, count: int) -> list[np.ndarray]:
    """Inputs from small to far past the quantized range (the saturating ends included)."""
    rng = np.random.RandomState(seed)
    return [(rng.randn(2, cin, hw, hw) * (0.3 + 3 * i)).astype(np.float32) for i in range(count)]


def _exact(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with its int8 weights as the same integers in uint8 (plus 128, zero point 128):
    ORT fuses it into its u8u8 kernel, exact on every CPU, where its u8s8 one adds pairs in
    saturating int16 on a CPU without VNNI (runtime/sim_kernels.py)."""
    exact = onnx.ModelProto()
    exact.CopyFrom(model)
    inits = {i.name: i for i in exact.graph.initializer}
    w = numpy_helper.to_array(inits["w"])
    if w.dtype == np.int8:
        inits["w"].CopyFrom(
            numpy_helper.from_array((w.astype(np.int16) + 128).astype(np.uint8), "w")
        )
        zero = np.full(numpy_helper.to_array(inits["w_zero"]).shape, 128, np.uint8)
        inits["w_zero"].CopyFrom(numpy_helper.from_array(zero, "w_zero"))
    return exact


@pytest.mark.parametrize(
    "case",
    [
        dict(seed=1),  # 3 -> 16, 3x3, stride 2: MobileNetV3's stem
        dict(seed=2, cin=1, cout=8, k=5, stride=1),
        dict(seed=3, cin=2, cout=16, k=4, stride=4),
        dict(seed=4, x_zero=0),  # the `mixed` form of a Relu'd input
        dict(seed=5, x_zero=37),
        dict(seed=6, w_dtype=np.uint8),  # the u8u8 form
        dict(seed=7, bias_max=2_000_000, y_mul=20.0),
    ],
    ids=["stem", "1ch-5x5", "patchify", "zp0", "zp37", "u8u8", "big-bias"],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_the_float_form_gives_the_fused_integer_convs_bytes(case: dict, threads: int) -> None:
    model = _conv_graph(**case)
    rewritten, count = _rewritten(model)
    assert count == 1
    ops = [n.op_type for n in rewritten.graph.node]
    assert "Mul" in ops and ops.count("DequantizeLinear") == 2  # the new one, and the Relu's
    fused, floated = _session(_exact(model), threads), _session(rewritten, threads)
    conv_out = []
    for x in _inputs(model.graph.input[0].type.tensor_type.shape.dim[1].dim_value, 33, 9, 8):
        want, got = fused.run(None, {"x": x}), floated.run(None, {"x": x})
        for w, g in zip(want, got, strict=True):
            assert w.dtype == g.dtype == np.uint8
            np.testing.assert_array_equal(g, w)
        conv_out.append(want[1])
    # not only saturated bytes compared: many of the conv's outputs lie inside the range
    every = np.concatenate([o.ravel() for o in conv_out])
    assert np.mean((every > 0) & (every < 255)) > 0.1 and len(np.unique(every)) > 16


@pytest.mark.parametrize(
    "case, why",
    [
        (dict(cout=17), "more output channels than MAX_OUT"),
        (dict(cin=4, k=3), "K = 36 > MAX_K"),
        (dict(cin=16, k=1, stride=1), "a 1x1 conv is a plain GEMM"),
        (dict(cin=4, cout=4, k=3, group=4), "grouped (depthwise)"),
        (dict(bias_max=2**24), "a bias whose sums leave float32's exact integers"),
        (dict(), "weights scaled per input channel (axis 1), which ORT does not fuse"),
    ],
)
def test_what_is_not_narrow_or_not_exact_stays_an_integer_conv(case: dict, why: str) -> None:
    model = _conv_graph(**case)
    if not case:
        dq = next(n for n in model.graph.node if n.output[0] == "wd")
        dq.attribute[0].i = 1
        _set(model, "w_scale", np.full(3, 0.01, np.float32))
        _set(model, "w_zero", np.zeros(3, np.int8))
    if "bias_max" in case:  # make sure one bias reaches the bound
        bias = next(i for i in model.graph.initializer if i.name == "b")
        values = numpy_helper.to_array(bias).copy()
        values[0] = 2**24
        bias.CopyFrom(numpy_helper.from_array(values, "b"))
    rewritten, count = _rewritten(model)
    assert count == 0, why
    assert rewritten == model


def test_the_bound_is_the_weights_own_sum() -> None:
    """The exactness bound uses the conv's actual weights: the largest reachable |accumulator|
    of the rewritten stems stays well below 2^24, and a bias just under the bound's remainder
    is still rewritten."""
    model = _conv_graph(bias_max=0)
    w = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "w"))
    reach = int(np.abs(w.astype(np.int64)).reshape(16, -1).sum(1).max()) * 128
    bias = next(i for i in model.graph.initializer if i.name == "b")
    values = numpy_helper.to_array(bias).copy()
    values[:] = 2**24 - reach - 1
    bias.CopyFrom(numpy_helper.from_array(values, "b"))
    assert _rewritten(model)[1] == 1
    values[:] = 2**24 - reach + 1
    for b in values:
        assert b > 0
    bias.CopyFrom(numpy_helper.from_array(values, "b"))
    assert _rewritten(model)[1] == 0


class Stem(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.Hardswish())
        self.body = nn.Sequential(nn.Conv2d(16, 32, 3, 1, 1), nn.ReLU(), nn.Conv2d(32, 8, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.stem(x))


@pytest.mark.parametrize("path", ["u8s8", "u8u8", "mixed"])
def test_a_compiled_stem_runs_as_a_float_conv_and_keeps_the_integer_numbers(path: str) -> None:
    """Through torch.compile: the sim reports its narrow conv, and its session gives the bytes
    the plain integer form gives for the partition's own exported graph (the float form, as on
    a CPU without AVX512-VNNI: sim_narrow_op=False; test_narrow_op.py has the op)."""
    from torch_fl.bpu.runtime import sim_kernels

    if sim_kernels.probe(path) is not None:
        pytest.skip(f"sim_kernels={path!r} here: {sim_kernels.probe(path)}")
    torch.manual_seed(0)
    model = Stem().eval()
    with torch.no_grad():
        model.stem[1].running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 3, 32, 32)
    compiled = compile_bpu(model, executor="sim", cache=False, sim_kernels=path,
                           calibrate="first-call", sim_threads=1, sim_narrow_op=False)  # fmt: skip
    with report.collect() as reps, torch.no_grad():
        out = compiled(x)
    (runtime,) = [r for r in runtimes(reps) if r.kind == "sim"]
    assert runtime._exec.narrow_convs == 1
    rep = report.Report(list(reps))
    part = rep.graphs[0].partitions[0]
    assert part.sim_kernels["narrow_convs"] == 1
    assert (
        f"sim narrow convs: graph {rep.graphs[0].graph_id} part {part.id}: 1 integer conv with "
        "few channels as exact float convs"
    ) in rep.table()
    onnx_bytes = runtime.last_build.onnx_bytes
    plain = to_integer_form(onnx.load_from_string(onnx_bytes), path)
    floated, count = fused_graph(onnx_bytes, path)
    assert count == 1
    a, b = _session(plain), _session(floated)
    names = [i.name for i in a.get_inputs()]
    assert len(names) == 1
    for scale in (0.5, 1.0, 4.0):
        feed = {names[0]: (x * scale).numpy()}
        for want, got in zip(a.run(None, feed), b.run(None, feed), strict=True):
            np.testing.assert_array_equal(got, want)
    assert torch.isfinite(out).all()


def _set(model: onnx.ModelProto, name: str, value: np.ndarray) -> None:
    init = next(i for i in model.graph.initializer if i.name == name)
    init.CopyFrom(numpy_helper.from_array(value, name))


@pytest.mark.parametrize(
    "x_scale, w_scale, y_scale, acc",
    [
        (0.06535884, 0.016332097, 0.27873796, 19715),
        (0.06593915, 0.019769272, 0.23339552, -6177),
        (0.08538262, 0.011719806, 0.19377778, 15976),
    ],
)
def test_the_requantization_scale_is_formed_as_onnx_runtime_forms_it(
    x_scale: float, w_scale: float, y_scale: float, acc: int
) -> None:
    """Scales where (x * w) / y and x * (w / y) differ in float32, and an accumulator that the
    two round to different bytes (found by search): the float form must give ORT's byte."""
    xs, ws, ys = np.float32(x_scale), np.float32(w_scale), np.float32(y_scale)
    one_order, other = (
        np.rint(np.float32(acc) * ((xs * ws) / ys)),
        np.rint(np.float32(acc) * (xs * (ws / ys))),
    )
    assert one_order != other  # the case can tell the orders apart
    model = _conv_graph(cin=1, cout=1, k=3, stride=1, hw=5)
    weight = np.zeros((1, 1, 3, 3), np.int8)
    weight[0, 0, 1, 1] = 1  # the accumulator is the centre input plus the bias
    value = 10
    for name, array in [
        ("w", weight), ("w_scale", np.array([ws])), ("x_scale", np.array(xs)),
        ("y_scale", np.array(ys)), ("b_scale", np.array([xs * ws])),
        ("b", np.array([acc - value], np.int32)),
    ]:  # fmt: skip
        _set(model, name, array)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    x = np.full((1, 1, 5, 5), value * xs, np.float32)
    rewritten, count = _rewritten(model)
    assert count == 1
    fused = _session(model).run(None, {"x": x})[1]
    floated = _session(rewritten).run(None, {"x": x})[1]
    np.testing.assert_array_equal(floated, fused)
    assert set(np.unique(fused)) <= {one_order + 128, other + 128}


def test_scales_and_zero_points_of_other_sizes_leave_the_conv_alone() -> None:
    """Quantization parameters that match no per-tensor or per-output-channel layout (a graph
    the integer form never writes) are skipped, not an exception in the sim's build."""
    for name, value in [
        ("w_scale", np.full(5, 0.01, np.float32)),
        ("w_zero", np.zeros(5, np.int8)),
        ("x_zero", np.full(2, 128, np.uint8)),
        ("y_zero", np.full(2, 128, np.uint8)),
    ]:
        model = _conv_graph()
        _set(model, name, value)
        rewritten, count = _rewritten(model)
        assert count == 0, name
        assert rewritten == model

"""The sim executor's kernel paths (runtime/sim_kernels.py, conversion/integer_form.py).

- the integer form represents exactly the values of the reference Q/DQ graph;
- on the zoo, for every fused path this CPU can run (u8s8 where it has VNNI; u8u8, the path of
  CPUs without VNNI, forced), every conv/gemm/matmul's int32 accumulation fits int32 and its
  requantized output is within one quantization step of an int64 reference computed from the
  same int8 inputs;
- the probe catches a saturating kernel (a stand-in emulating AVX2's int16 pair sums), and
  `auto` then falls back to u8u8, and to float when that fails too;
- the chosen path is reported.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from onnx import helper, numpy_helper

import torch_fl.bpu as bpu
from tests.compile.bpu_helpers import compile_bpu
from tests.support.zoo import build
from torch_fl.bpu import report
from torch_fl.bpu.conversion.export import attribute
from torch_fl.bpu.conversion.integer_form import to_integer_form
from torch_fl.bpu.errors import ExecutorUnavailableError
from torch_fl.bpu.runtime import sim_kernels

ZOO_MODELS = ("resnet18", "mobilenetv3_small", "vit", "convnext")
FUSED_PATHS = [
    pytest.param(
        "u8s8",
        marks=pytest.mark.skipif(
            sim_kernels.probe("u8s8") is not None, reason="u8s8 kernels saturate on this CPU"
        ),
    ),
    "mixed",  # what a CPU without VNNI runs: u8s8 on Relu'd inputs, u8u8 elsewhere
    "u8u8",  # exact everywhere
]


def _session(model: onnx.ModelProto, fused: bool) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not fused:
        options.add_session_config_entry("session.disable_quant_qdq", "1")
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])


def _calibrated_reference(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The calibrated reference Q/DQ graph of the zoo model's (first) partition, and its feed."""
    model, x = build(name)
    torch._dynamo.reset()
    generator = torch.Generator().manual_seed(5)
    samples = [torch.randn(x.shape, generator=generator) for _ in range(2)]
    with report.collect() as reps:
        sim = compile_bpu(model, executor="sim", cache=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            bpu.calibrate(sim, samples)
        with torch.no_grad():
            sim(x)
    runtime = reps[0].runtimes[0]
    graph = onnx.load_from_string(runtime.last_build.onnx_bytes)
    names = [i.name for i in graph.graph.input]
    assert len(names) == 1, names  # the zoo's partitions read the image only
    return graph, {names[0]: x.numpy()}


def _with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    have = {o.name for o in out.graph.output}
    out.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names if n not in have)
    return out


class _Layer:
    """One weight op of the reference graph with its quantized input, weight, bias, output."""

    def __init__(self, node, x_q, w, w_scale, axis, bias, out_q, out_scale, relu):
        self.node, self.x_q, self.w, self.w_scale, self.axis = node, x_q, w, w_scale, axis
        self.bias, self.out_q, self.out_scale, self.relu = bias, out_q, out_scale, relu


def _layers(model: onnx.ModelProto) -> list[_Layer]:
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    readers: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    layers = []
    for node in model.graph.node:
        if node.op_type not in ("Conv", "Gemm", "MatMul"):
            continue
        wdq = producer.get(node.input[1])
        xdq = producer.get(node.input[0])
        if wdq is None or wdq.input[0] not in inits or xdq is None:
            continue  # activation x activation matmul: float output, not requantized
        assert xdq.op_type == "DequantizeLinear"
        end, relu = node.output[0], False
        users = readers.get(end, [])
        if len(users) == 1 and users[0].op_type == "Relu":
            end, relu = users[0].output[0], True
            users = readers.get(end, [])
        qs = [u for u in users if u.op_type == "QuantizeLinear"]
        if not qs:
            continue  # a graph output: stays float
        bias = None
        if len(node.input) > 2 and node.input[2]:
            bdq = producer[node.input[2]]
            bias = inits[bdq.input[0]].astype(np.int64)
        layers.append(
            _Layer(
                node,
                xdq.input[0],
                inits[wdq.input[0]].astype(np.int64),
                inits[wdq.input[1]].astype(np.float64),
                attribute(wdq, "axis", 1),
                bias,
                qs[0].output[0],
                float(inits[qs[0].input[1]]),
                relu,
            )
        )
    return layers


def _accumulate(layer: _Layer, xq: np.ndarray) -> np.ndarray:
    """The int32 accumulator of `layer` computed exactly (float64 holds these integers)."""
    x = torch.from_numpy(xq.astype(np.float64))
    w = torch.from_numpy(layer.w.astype(np.float64))
    node = layer.node
    if node.op_type == "Conv":
        pads = attribute(node, "pads", [0] * (2 * (w.ndim - 2)))
        half = len(pads) // 2
        x = F.pad(x, [p for i in reversed(range(half)) for p in (pads[i], pads[i + half])])
        acc = F.conv2d(
            x,
            w,
            stride=attribute(node, "strides", [1, 1]),
            dilation=attribute(node, "dilations", [1, 1]),
            groups=attribute(node, "group", 1),
        )
        channel_axis = 1
    elif node.op_type == "Gemm":
        acc = x @ (w.T if attribute(node, "transB", 0) else w)
        channel_axis = -1
    else:
        acc = x @ w
        channel_axis = -1
    acc = acc.numpy().round().astype(np.int64)
    if layer.bias is not None:
        shape = [1] * acc.ndim
        shape[channel_axis] = -1
        acc = acc + layer.bias.reshape(shape)
    return acc, channel_axis


def _zero_points(fast: onnx.ModelProto) -> dict[str, int]:
    """Each quantized tensor's zero point in the integer form (128, or 0 where `mixed` holds a
    Relu'd tensor as uint8 0..127), read from the DequantizeLinear nodes that read it."""
    inits = {i.name: numpy_helper.to_array(i) for i in fast.graph.initializer}
    return {
        n.input[0]: int(inits[n.input[2]])
        for n in fast.graph.node
        if n.op_type == "DequantizeLinear" and len(n.input) > 2 and n.input[0] not in inits
    }


def _check_layers(reference: onnx.ModelProto, fast: onnx.ModelProto, feed):
    """Per layer: |acc| < 2^31 and fast requantized output within one step of int64."""
    layers = _layers(reference)
    assert layers
    names = sorted({n for layer in layers for n in (layer.x_q, layer.out_q)})
    values = dict(
        zip(names, _session(_with_outputs(fast, names), True).run(names, feed), strict=True)
    )
    x_scales = {i.name: numpy_helper.to_array(i) for i in reference.graph.initializer}
    zero_points = _zero_points(fast)
    for layer in layers:
        xq = values[layer.x_q].astype(np.int64) - zero_points[layer.x_q]
        acc, axis = _accumulate(layer, xq)
        assert np.abs(acc).max() < 2**31, f"{layer.node.name}: int32 accumulator overflows"
        x_scale = float(x_scales[layer.x_q.replace("_quantized", "_scale")])
        shape = [1] * acc.ndim
        shape[axis] = -1
        w_scale = layer.w_scale.reshape(shape) if layer.w_scale.ndim else layer.w_scale
        want = np.clip(np.rint(acc * (x_scale * w_scale / layer.out_scale)), -128, 127)
        if layer.relu:
            want = np.maximum(want, 0)
        got = values[layer.out_q].astype(np.int64) - zero_points.get(layer.out_q, 128)
        step = int(np.abs(got - want).max())
        assert step <= 1, f"{layer.node.op_type} {layer.node.name}: {step} steps from int64"
    return len(layers)


@pytest.mark.parametrize("path", FUSED_PATHS)
@pytest.mark.parametrize("name", ZOO_MODELS)
def test_zoo_integer_kernels_match_int64_reference(name, path):
    reference, feed = _calibrated_reference(name)
    fast = to_integer_form(reference, path)
    assert _check_layers(reference, fast, feed) >= 3
    if path == "mixed" and name in ("resnet18", "mobilenetv3_small"):
        # Relu'd tensors held as uint8 0..127 and read by int8-weight (u8s8) ops
        assert 0 in _zero_points(fast).values()
        assert any(i.data_type == onnx.TensorProto.INT8 and i.dims for i in fast.graph.initializer)
    # and the whole partition: the fused session against the float Q/DQ reference
    (ref_out,) = _session(reference, False).run(None, feed)[:1]
    (fast_out,) = _session(fast, True).run(None, feed)[:1]
    a, b = ref_out.ravel().astype(np.float64), fast_out.ravel().astype(np.float64)
    assert a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) > 0.9995


@pytest.mark.parametrize("path", ("u8s8", "mixed", "u8u8"))
def test_integer_form_represents_the_same_values(path):
    """Run without fusion (Q/DQ as float steps), the rewritten graph is bit-identical."""
    reference, feed = _calibrated_reference("resnet18")
    fast = to_integer_form(reference, path)
    want = _session(reference, False).run(None, feed)
    got = _session(fast, False).run(None, feed)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a, b)
    # every op -> Relu -> Q chain became op -> Q -> Max (a Relu left has other readers too)
    readers: dict[str, list] = {}
    for n in fast.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    left = [
        n
        for n in fast.graph.node
        if n.op_type == "Relu"
        and [r.op_type for r in readers.get(n.output[0], [])] == ["QuantizeLinear"]
    ]
    clamps = {n.op_type for n in fast.graph.node if n.name.endswith("::clamp_int")}
    assert not left and ("Clip" in clamps if path == "mixed" else clamps == {"Max"})
    u8 = [i for i in fast.graph.initializer if i.data_type == onnx.TensorProto.UINT8 and i.dims]
    assert bool(u8) == (path != "u8s8")  # weights shifted for u8u8, and in mixed beside Relu


def _saturating_u8s8(model: onnx.ModelProto):
    """Stand-in for a CPU without VNNI: the probe's conv computed as AVX2's u8s8 kernels do,
    adding pairs of u8 x s8 products in saturating int16 before the int32 sum."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    producer = {o: n for n in model.graph.node for o in n.output}
    wdq = producer[conv.input[1]]
    w = inits[wdq.input[0]].astype(np.int64)
    w_scale = inits[wdq.input[1]].astype(np.float64)
    x_dq = producer[conv.input[0]]
    x_scale = float(inits[x_dq.input[1]])
    x_zp = int(inits[x_dq.input[2]])
    # `mixed`: the conv reads Relu'd values, Q(zero point 0) -> Clip(0, 127)
    clip = producer.get(x_dq.input[0])
    low, high = (
        (int(inits[clip.input[1]]), int(inits[clip.input[2]]))
        if clip is not None and clip.op_type == "Clip"
        else (0, 255)
    )
    yq_node = next(n for n in model.graph.node if n.input and n.input[0] == conv.output[0])
    y_scale, y_zp = float(inits[yq_node.input[1]]), int(inits[yq_node.input[2]])
    k = w.shape[-1]

    def run(x: np.ndarray) -> np.ndarray:
        xu = np.clip(np.rint(x / x_scale) + x_zp, low, high).astype(np.int64)
        c, h, wd = xu.shape[1:]
        pad = np.pad(xu[0], ((0, 0), (k // 2, k // 2), (k // 2, k // 2)), constant_values=x_zp)
        cols = np.stack(
            [pad[:, i : i + h, j : j + wd] for i in range(k) for j in range(k)], axis=1
        ).reshape(c * k * k, h * wd)
        wk = w.reshape(w.shape[0], -1)
        prods = wk[:, :, None] * cols[None, :, :]  # u8 x s8
        pairs = np.clip(prods[:, 0::2] + prods[:, 1::2], -32768, 32767)
        acc = pairs.sum(1) - x_zp * wk.sum(1)[:, None]
        y = np.clip(np.rint(acc * x_scale * w_scale[:, None] / y_scale) + y_zp, 0, 255)
        return ((y - y_zp) * y_scale).reshape(1, -1, h, wd).astype(np.float32)

    return run


def test_probe_catches_a_saturating_kernel_and_passes_an_exact_one():
    failure = sim_kernels.probe("u8s8", runner=_saturating_u8s8)
    assert failure is not None and "saturating" in failure and "u8s8" in failure
    assert sim_kernels.probe("u8u8") is None  # ORT's u8u8 kernels never saturate


@pytest.fixture
def cpu(monkeypatch):
    """Pretend to be another CPU: its flags, and the probe's verdict per path."""
    sim_kernels.choose.cache_clear()

    def pretend(flags, verdicts):
        monkeypatch.setattr(sim_kernels, "cpu_flags", lambda: frozenset(flags))
        monkeypatch.setattr(sim_kernels, "_verdict", lambda path: verdicts.get(path))

    yield pretend
    sim_kernels.choose.cache_clear()


def test_auto_picks_u8s8_with_vnni(cpu):
    cpu({"avx2", "avx512_vnni"}, {})
    assert sim_kernels.choose("auto").path == "u8s8"


def test_auto_without_vnni_uses_mixed_then_u8u8(cpu):
    cpu({"avx2", "fma"}, {"u8s8": "would saturate"})
    choice = sim_kernels.choose("auto")
    assert choice.path == "mixed" and "without VNNI" in choice.reason
    sim_kernels.choose.cache_clear()
    cpu({"avx2", "fma"}, {"u8s8": "would saturate", "mixed": "mixed kernels are not exact"})
    choice = sim_kernels.choose("auto")
    assert choice.path == "u8u8" and "mixed kernels are not exact" in choice.reason


def test_mixed_probe_passes_where_u8s8_saturates():
    """On Relu'd inputs (0..127) even AVX2's saturating int16 pair sums are exact."""
    assert sim_kernels.probe("u8s8", runner=_saturating_u8s8) is not None
    assert sim_kernels.probe("mixed", runner=_saturating_u8s8) is None


def test_auto_with_vnni_flag_but_inexact_probe_falls_back(cpu):
    cpu(
        {"avx512_vnni"},
        {"u8s8": "u8s8 kernels are not exact", "mixed": "mixed not exact", "u8u8": "u8u8 not"},
    )
    choice = sim_kernels.choose("auto")
    assert choice.path == "float" and "u8s8 kernels are not exact" in choice.reason


def test_vnni_flag_with_saturating_u8s8_takes_mixed_next(cpu):
    """The probe decides, not the flags: a VNNI flag whose u8s8 kernels saturate (AVX2 kernels
    behind it) gets `mixed`, the next fastest exact path, before `u8u8`."""
    cpu({"avx512_vnni"}, {"u8s8": "u8s8 kernels are not exact"})
    choice = sim_kernels.choose("auto")
    assert choice.path == "mixed"
    assert "u8s8 kernels are not exact" in choice.reason and "Relu'd" in choice.reason


def test_forced_path_that_is_not_exact_here_is_an_error(cpu):
    cpu({"avx2"}, {"u8s8": "u8s8 kernels are not exact on this CPU"})
    with pytest.raises(ExecutorUnavailableError, match="sim_kernels='u8s8'.*auto"):
        sim_kernels.choose("u8s8")


@pytest.mark.parametrize(
    ("options", "path"),
    [
        ({"sim_kernels": "u8u8"}, "u8u8"),
        ({"sim_kernels": "mixed"}, "mixed"),
        ({"sim_kernels": "float"}, "float"),
        ({"sim_weights": "live"}, "float"),
    ],
)
def test_kernel_path_reported_and_used(options, path):
    model, x = build("resnet18")
    torch._dynamo.reset()
    with report.collect() as reps, torch.no_grad():
        out = compile_bpu(model, executor="sim", cache=False, **options)(x)
        ref = model(x)
    rep = report.Report(list(reps))
    (partition,) = rep.partitions
    assert partition.sim_kernels["path"] == path
    assert f"sim kernels: {path}" in rep.table()
    assert rep.to_dict()["sim_kernels"] == [path]
    assert reps[0].runtimes[0]._exec.kernels.path == path
    cos = F.cosine_similarity(out.flatten(), ref.flatten(), 0)
    assert cos > 0.98  # default scales, uncalibrated: int8 numerics, not a broken graph


def test_bad_kernel_setting_is_rejected():
    with pytest.raises(
        bpu.SettingsError, match="sim_kernels.*valid: auto\\|u8s8\\|mixed\\|u8u8\\|float"
    ):
        bpu.resolve({"sim_kernels": "avx"})


def test_integer_form_ort_rejects_falls_back_to_float_with_a_warning(monkeypatch):
    """A graph whose integer form ONNX Runtime cannot load still runs, exactly, on float Q/DQ."""
    from torch_fl.bpu.runtime import executors

    def broken(model, path):
        bad = onnx.ModelProto()
        bad.CopyFrom(model)
        bad.graph.node[0].op_type = "NoSuchOp"
        return bad

    monkeypatch.setattr(executors, "to_integer_form", broken)
    model, x = build("resnet18")
    torch._dynamo.reset()
    with report.collect() as reps, torch.no_grad():
        with pytest.warns(UserWarning, match="integer kernels could not run.*float Q/DQ"):
            out = compile_bpu(model, executor="sim", cache=False, sim_kernels="u8u8")(x)
        ref = model(x)
    (partition,) = report.Report(list(reps)).partitions
    assert partition.sim_kernels["path"] == "float"
    assert "u8u8 form rejected" in partition.sim_kernels["reason"]
    assert F.cosine_similarity(out.flatten(), ref.flatten(), 0) > 0.98


def _erf_gelu_graph(order: str, extra_reader: bool = False) -> onnx.ModelProto:
    """Q -> DQ -> the exporter's erf GELU -> Q -> DQ, in one of its two Mul orders
    ("x_last": (x * (1 + erf)) * 0.5, "half_first": (0.5 * x) * (1 + erf)); with
    `extra_reader` the Erf's result is also a graph output (the chain must stay)."""
    consts = {"s": 0.05, "sqrt2": float(np.sqrt(2.0)), "one": 1.0, "half": 0.5, "so": 0.04}
    inits = [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in consts.items()]
    inits.append(numpy_helper.from_array(np.array(0, np.int8), "z"))
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
        helper.make_node("Div", ["xd", "sqrt2"], ["t"]),
        helper.make_node("Erf", ["t"], ["e"]),
        helper.make_node("Add", ["one", "e"], ["a"]),
    ]
    if order == "x_last":
        nodes += [
            helper.make_node("Mul", ["a", "xd"], ["m"]),
            helper.make_node("Mul", ["m", "half"], ["g"]),
        ]
    else:
        nodes += [
            helper.make_node("Mul", ["half", "xd"], ["h"]),
            helper.make_node("Mul", ["h", "a"], ["g"]),
        ]
    nodes += [
        helper.make_node("QuantizeLinear", ["g", "so", "z"], ["gq"]),
        helper.make_node("DequantizeLinear", ["gq", "so", "z"], ["out"]),
    ]
    outputs = [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, None)]
    if extra_reader:
        outputs.append(helper.make_tensor_value_info("e", onnx.TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes,
        "gelu",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 512])],
        outputs,
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("order", ("x_last", "half_first"))
@pytest.mark.parametrize("path", ("u8s8", "u8u8", "mixed"))
def test_erf_gelu_becomes_one_gelu_with_the_same_values(order, path):
    reference = _erf_gelu_graph(order)
    fast = to_integer_form(reference, path)
    ops = [n.op_type for n in fast.graph.node]
    assert ops.count("Gelu") == 1 and not {"Erf", "Div", "Mul", "Add"} & set(ops), ops
    feed = {"x": np.random.default_rng(3).uniform(-6.4, 6.3, (4, 512)).astype(np.float32)}
    (want,) = _session(reference, False).run(None, feed)
    for fused in (False, True):
        (got,) = _session(fast, fused).run(None, feed)
        steps = np.abs(np.rint(got / 0.04) - np.rint(want / 0.04))
        # the same function: an output differs, if at all, by a float rounding at a step edge
        assert steps.max() <= 1 and (steps > 0).mean() < 0.01


def test_erf_gelu_whose_intermediate_is_read_elsewhere_is_kept():
    reference = _erf_gelu_graph("x_last", extra_reader=True)
    fast = to_integer_form(reference, "u8s8")
    ops = [n.op_type for n in fast.graph.node]
    assert "Gelu" not in ops and "Erf" in ops


def _mean_graph(axes: list[int], keepdims: int = 1, opset: int = 17) -> onnx.ModelProto:
    """Q -> DQ -> ReduceMean(axes) -> Q -> DQ on a 2x8x7x9 input (axes an attribute before
    opset 18, an input from it)."""
    inits = [
        numpy_helper.from_array(np.array(0.05, np.float32), "s"),
        numpy_helper.from_array(np.array(0.013, np.float32), "so"),
        numpy_helper.from_array(np.array(0, np.int8), "z"),
    ]
    if opset >= 18:
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
        mean = helper.make_node("ReduceMean", ["xd", "axes"], ["m"], keepdims=keepdims)
    else:
        mean = helper.make_node("ReduceMean", ["xd"], ["m"], axes=axes, keepdims=keepdims)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
        mean,
        helper.make_node("QuantizeLinear", ["m", "so", "z"], ["mq"]),
        helper.make_node("DequantizeLinear", ["mq", "so", "z"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mean",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8, 7, 9])],
        [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize(("axes", "opset"), (([-1, -2], 17), ([2, 3], 17), ([3, 2], 18)))
@pytest.mark.parametrize("path", ("u8s8", "u8u8", "mixed"))
def test_spatial_mean_runs_as_integer_global_average_pool(axes, opset, path, tmp_path):
    reference = _mean_graph(axes, opset=opset)
    fast = to_integer_form(reference, path)
    ops = [n.op_type for n in fast.graph.node]
    assert "GlobalAveragePool" in ops and "ReduceMean" not in ops, ops
    optimized = tmp_path / "optimized.onnx"
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(optimized)
    ort.InferenceSession(fast.SerializeToString(), options, ["CPUExecutionProvider"])
    assert "QLinearGlobalAveragePool" in {n.op_type for n in onnx.load(optimized).graph.node}
    feed = {"x": np.random.default_rng(5).uniform(-6.4, 6.3, (2, 8, 7, 9)).astype(np.float32)}
    (want,) = _session(reference, False).run(None, feed)
    (got,) = _session(fast, True).run(None, feed)
    assert got.shape == want.shape == (2, 8, 1, 1)
    steps = np.abs(np.rint(got / 0.013) - np.rint(want / 0.013))
    assert steps.max() <= 1  # one integer sum, one rounding: at most a step at an edge


@pytest.mark.parametrize(("axes", "keepdims"), (([1], 1), ([-1], 1), ([2, 3], 0), ([1, 2, 3], 1)))
def test_a_mean_that_is_not_a_spatial_pool_stays_a_mean(axes, keepdims):
    fast = to_integer_form(_mean_graph(axes, keepdims), "u8s8")
    ops = [n.op_type for n in fast.graph.node]
    assert "ReduceMean" in ops and "GlobalAveragePool" not in ops, ops

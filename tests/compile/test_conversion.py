import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

from tests.compile.bpu_helpers import compile_bpu
from torch_fl.bpu import report
from torch_fl.bpu.conversion import qdq


def _built(model, x, **options):
    options.setdefault("calibrate", "none")  # these tests read the default-scale Q/DQ graph
    with report.collect() as reps, torch.no_grad():
        compile_bpu(model, **options)(x)
    rt = reps[0].runtimes[0]
    return rt, onnx.load_from_string(rt.last_build.onnx_bytes)


def test_per_channel_weight_scales_exact_against_reference():
    model = nn.Sequential(nn.Conv2d(3, 5, 3), nn.ReLU()).eval()
    with torch.no_grad():
        model[0].weight[2].zero_()  # an all-zero channel must still get a valid scale
    rt, m = _built(model, torch.randn(1, 3, 8, 8), executor="sim")
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    w = model[0].weight.detach().numpy()
    ref_scale = np.abs(w).reshape(5, -1).max(1) / 127.0
    ref_scale[2] = 1.0
    ref_q = np.clip(np.rint(w / ref_scale[:, None, None, None]), -127, 127).astype(np.int8)
    (qname,) = [n for n, v in inits.items() if v.dtype == np.int8 and v.ndim == 4]
    base = qname[: -len("_quantized")]
    np.testing.assert_array_equal(inits[qname], ref_q)
    np.testing.assert_allclose(inits[base + "_scale"], ref_scale.astype(np.float32), rtol=0)
    dq = next(n for n in m.graph.node if n.output[0] == base + "_dequantized")
    assert dq.op_type == "DequantizeLinear" and dq.attribute[0].i == 0  # axis 0 = out channels
    # activation Q/DQ with the default scale, zero point int8 0
    q = next(n for n in m.graph.node if n.op_type == "QuantizeLinear")
    assert float(inits[q.input[1]]) == pytest.approx(0.05)
    assert inits[q.input[2]].dtype == np.int8 and int(inits[q.input[2]]) == 0


def test_gemm_matmul_pool_inputs_quantized_and_quantize_false_is_float():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.fc = nn.Linear(16, 6)

        def forward(self, x):
            y = torch.nn.functional.max_pool2d(self.conv(x), 2)
            z = self.fc(torch.nn.functional.avg_pool2d(y, 2).flatten(1))
            return z @ z.t()

    x = torch.randn(1, 3, 8, 8)
    _, m = _built(Net().eval(), x, executor="sim")
    qdq.verify_quantized(m)
    ops = [n.op_type for n in m.graph.node]
    for op in ("Conv", "MaxPool", "AveragePool"):
        assert op in ops
    assert ops.count("QuantizeLinear") >= 5
    torch._dynamo.reset()
    _, f = _built(Net().eval(), x, executor="sim", quantize=False)
    assert "QuantizeLinear" not in [n.op_type for n in f.graph.node]


def test_failed_qdq_is_an_error_not_a_float_artifact():
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Conv", ["x", "w"], ["y"], "conv")],
        "g",
        [
            onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1, 4, 4]),
            onnx.helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [1, 1, 3, 3]),
        ],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 1, 2, 2])],
    )
    with pytest.raises(qdq.QuantizationError, match="not a constant"):
        qdq.quantize_model(onnx.helper.make_model(graph), {}, 0.05)
    with pytest.raises(qdq.QuantizationError, match="left float inputs"):
        qdq.verify_quantized(onnx.helper.make_model(graph))


def test_export_names_stable_and_unique():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    rt, m1 = _built(model, x, executor="sim", cache=False)
    torch._dynamo.reset()
    _, m2 = _built(model, x, executor="sim", cache=False)
    assert m1.SerializeToString(deterministic=True) == m2.SerializeToString(deterministic=True)
    assert [i.name for i in m1.graph.input] == list(rt.spec.input_names)
    assert [o.name for o in m1.graph.output] == ["output_0"]
    names = [o for n in m1.graph.node for o in n.output]
    assert len(names) == len(set(names))
    assert all(vi.type.tensor_type.shape.dim for vi in m1.graph.output)  # shapes inferred

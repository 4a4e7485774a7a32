"""The int8 scheme of the reference Q/DQ graph (conversion/qdq.py, conversion/fold_bn.py):
BN folded before weights are quantized, each conv/gemm requantized where its result ends, a
quantized tensor read quantized by every reader, MaxPool keeping its input's scale."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

from tests.compile.bpu_helpers import compile_bpu
from torch_fl.bpu import report
from torch_fl.bpu.conversion import qdq
from torch_fl.bpu.conversion.calibration import RangeObserver
from torch_fl.bpu.conversion.fold_bn import fold_batchnorm


def _graph(model, x, **options) -> onnx.ModelProto:
    torch._dynamo.reset()
    with report.collect() as reps, torch.no_grad():
        compile_bpu(model, executor="sim", cache=False, **options)(x)
    return onnx.load_from_string(reps[0].runtimes[0].last_build.onnx_bytes)


def _maps(m: onnx.ModelProto):
    producer = {o: n for n in m.graph.node for o in n.output}
    readers: dict[str, list] = {}
    for n in m.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    return producer, readers, inits


class Block(nn.Module):
    """conv-bn-relu, maxpool, a residual block, and a linear head (a graph output)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.pool = nn.MaxPool2d(2)
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = self.pool(self.stem(x))
        y = torch.relu(self.bn1(self.conv1(x)) + x)
        return self.fc(y.mean((2, 3)))


def _seeded(model):
    torch.manual_seed(0)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 2.0)
    return model.eval()


def test_batchnorm_is_folded_before_the_weight_is_quantized():
    model = _seeded(Block())
    m = _graph(model, torch.randn(1, 3, 16, 16))
    assert "BatchNormalization" not in {n.op_type for n in m.graph.node}
    producer, _, inits = _maps(m)
    conv = next(n for n in m.graph.node if n.op_type == "Conv")
    wdq = producer[conv.input[1]]
    bn, w = model.stem[1], model.stem[0].weight.detach()
    k = (bn.weight / torch.sqrt(bn.running_var + bn.eps)).detach()
    folded = (w * k[:, None, None, None]).numpy()
    scale = np.abs(folded).reshape(8, -1).max(1) / 127
    np.testing.assert_allclose(inits[wdq.input[1]], scale, rtol=1e-6)
    expected = np.clip(np.rint(folded / scale[:, None, None, None]), -127, 127)
    assert np.abs(inits[wdq.input[0]].astype(np.int64) - expected).max() <= 1


def test_conv_results_are_requantized_where_they_end_and_graph_outputs_stay_float():
    m = _graph(_seeded(Block()), torch.randn(1, 3, 16, 16))
    producer, readers, _ = _maps(m)
    convs = [n for n in m.graph.node if n.op_type == "Conv"]
    # stem: conv -> relu -> Q (the relu's output is the point); conv1: conv -> Q (read by Add)
    stem_end = readers[convs[0].output[0]]
    assert [n.op_type for n in stem_end] == ["Relu"]
    assert [n.op_type for n in readers[stem_end[0].output[0]]] == ["QuantizeLinear"]
    assert [n.op_type for n in readers[convs[1].output[0]]] == ["QuantizeLinear"]
    # the head's Gemm/MatMul writes the graph output itself: float
    (out,) = m.graph.output
    assert producer[out.name].op_type in ("Gemm", "MatMul", "Add")


def test_every_reader_of_a_quantized_tensor_reads_it_quantized():
    m = _graph(_seeded(Block()), torch.randn(1, 3, 16, 16))
    producer, _, _ = _maps(m)
    (add,) = [n for n in m.graph.node if n.op_type == "Add" and len(n.input) == 2]
    # the residual input (pool output, also read by conv1) and conv1's result: both int8
    assert [producer[i].op_type for i in add.input] == ["DequantizeLinear"] * 2


def test_maxpool_output_keeps_its_input_scale():
    m = _graph(_seeded(Block()), torch.randn(1, 3, 16, 16))
    producer, readers, inits = _maps(m)
    (pool,) = [n for n in m.graph.node if n.op_type == "MaxPool"]
    q_in = producer[producer[pool.input[0]].input[0]]
    q_out = next(n for n in readers[pool.output[0]] if n.op_type == "QuantizeLinear")
    assert float(inits[q_in.input[1]]) == float(inits[q_out.input[1]])


def test_fold_skips_a_conv_whose_output_is_read_twice():
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Conv", ["x", "w"], ["y"]),
        helper.make_node("BatchNormalization", ["y", "g", "b", "m", "v"], ["z"]),
        helper.make_node("Add", ["y", "z"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "xwgbmv"],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph)
    folded, count = fold_batchnorm(model, ["w", "g", "b", "m", "v"])
    assert count == 0 and [n.op_type for n in folded.graph.node] == [
        "Conv",
        "BatchNormalization",
        "Add",
    ]


def test_range_observer_lists_points_for_calibration():
    from onnx import TensorProto, helper

    w = numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["y"]),
        helper.make_node("Relu", ["y"], ["r"]),
        helper.make_node("Conv", ["r", "w"], ["y2"]),
        helper.make_node("Sigmoid", ["y2"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 2, 2])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 2, 2, 2])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert qdq.requant_points(model) == ["r", "y2"]
    observer = RangeObserver(model, "max", 99.99)
    assert {"x", "r", "y2"} <= set(observer.names)
    observer.observe([np.full((1, 2, 2, 2), 2.0, np.float32)])
    scales = observer.scales()
    assert scales["y2"] == scales["r"] * 2 == 8.0 / 127

"""The float runs a RangeObserver holds for its kept samples (conversion/calibration.py): the
health check reads them instead of running the float graph again, they equal a fresh run, a
replaced sample's run goes with it, the byte bound holds, and the outputs handed to the model
are not the held ones."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from torch_fl.bpu.conversion import calibration
from torch_fl.bpu.conversion.calibration import HEALTH_SAMPLES, RangeObserver


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.normal(size=(16, 8)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(size=(8, 4)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
        [w1, w2],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _samples(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.normal(size=(3, 16)).astype(np.float32) for _ in range(n)]


def _fresh(observer: RangeObserver, index: int) -> dict:
    return observer.run(dict(zip(observer.input_names, observer.kept_inputs[index], strict=False)))


def test_held_runs_equal_a_fresh_run_and_follow_the_reservoir():
    observer = RangeObserver(_model(), "max", 99.99)
    for x in _samples(HEALTH_SAMPLES * 3):
        observer.observe([x])
    assert len(observer.kept_inputs) == HEALTH_SAMPLES
    assert all(run is not None for run in observer.kept_runs)
    for index in range(HEALTH_SAMPLES):
        held, fresh = observer.kept_run(index), _fresh(observer, index)
        assert held is observer.kept_runs[index]
        assert held.keys() == fresh.keys()
        for name in fresh:
            np.testing.assert_array_equal(held[name], fresh[name])
    # the bytes counted are the bytes held (replaced samples' runs were released)
    held_bytes = sum(int(v.nbytes) for run in observer.kept_runs for v in run.values())
    assert observer._run_bytes == held_bytes


def test_the_outputs_handed_on_are_not_the_held_ones():
    observer = RangeObserver(_model(), "max", 99.99)
    (x,) = _samples(1)
    (out,) = observer.observe([x])
    want = observer.kept_runs[0]["y"].copy()
    out[...] = 12345.0  # the model writes to the partition's output in place
    np.testing.assert_array_equal(observer.kept_runs[0]["y"], want)


def test_past_the_byte_bound_a_sample_is_run_again(monkeypatch):
    observer = RangeObserver(_model(), "max", 99.99)
    samples = _samples(4)
    observer.observe([samples[0]])
    one_run = observer._run_bytes
    monkeypatch.setattr(calibration, "HEALTH_RUN_BYTES", one_run * 2)
    for x in samples[1:]:
        observer.observe([x])
    held = [run is not None for run in observer.kept_runs]
    assert held == [True, True, False, False]
    assert observer._run_bytes == one_run * 2
    fresh = _fresh(observer, 3)
    for name, value in observer.kept_run(3).items():
        np.testing.assert_array_equal(value, fresh[name])


@pytest.mark.parametrize("method", ["max", "percentile"])
def test_the_health_check_runs_the_float_graph_only_for_samples_not_held(monkeypatch, method):
    observer = RangeObserver(_model(), method, 99.99)
    for x in _samples(5):
        observer.observe([x])
    runs = []
    real = observer.run
    monkeypatch.setattr(observer, "run", lambda feed: runs.append(1) or real(feed))
    scales = observer.scales()
    worst, per_tensor = calibration._health_stats(observer, scales, 0.05, None)
    assert runs == []
    assert 0.9 < worst <= 1.0 and set(per_tensor) == set(observer.names)
    observer.kept_runs[2] = None  # one not held: that one runs again
    observer._run_bytes = 0
    calibration._health_stats(observer, scales, 0.05, None)
    assert len(runs) == 1

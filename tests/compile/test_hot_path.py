"""The Python frames between Dynamo's call of a compiled graph and its partitions' executors.

Each frame on that path costs a few microseconds a call once an int8 session has emptied the
caches (docs/compile.md, *The call path*): the graph's generated code calls each partition
runtime straight, with no lazy-module stand-in and no nn.Module call machinery in between.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from torch import nn

from tests.compile.bpu_helpers import compile_bpu
from tests.support.models import ConvStack, seeded
from torch_fl.bpu import report
from torch_fl.bpu.runtime import sim_threads
from torch_fl.bpu.runtime.executors import host_array


class _Recorder:
    """An executor stand-in wrapper: runs the real one and notes the frames above the call."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.frames: list[str] = []

    def __call__(self, args):
        frame = sys._getframe(1)
        names = []
        while frame is not None:
            names.append(frame.f_code.co_name)
            if frame.f_code.co_name == "run" and "report.py" in frame.f_code.co_filename:
                break  # report.noting's wrapper: what the backend hands to AOT
            frame = frame.f_back
        self.frames = names
        return self.inner(args)


def _compiled_with_recorder(model, x, executor="sim"):
    compiled = compile_bpu(model, executor=executor)
    with report.collect() as reps, torch.no_grad():
        for _ in range(sim_threads.CONFIRM_CALLS + 2):
            compiled(x)  # past the thread choice's confirmation: the hot path from here on
    part = next(r for g in reps for r in g.runtimes)
    recorder = _Recorder(part._exec)
    part._exec = recorder
    return compiled, recorder


@pytest.mark.parametrize("executor", ["sim", "eager"])
def test_partition_runs_straight_from_the_generated_graph_code(executor):
    model, x = seeded(ConvStack()), torch.randn(1, 3, 16, 16)
    compiled, recorder = _compiled_with_recorder(model, x, executor)
    with torch.no_grad():
        out = compiled(x)
    # the executor's caller: the partition's forward (or its profiler-range helper), called by
    # the graph's generated forward, called by report.noting's wrapper. A lazy graph module's
    # stand-in (`_lazy_forward`, `call_wrapped`) or nn.Module's `_call_impl` would sit between.
    frames = [f for f in recorder.frames if f != "_call"]
    assert frames == ["forward", "forward", "run"], recorder.frames
    with torch.no_grad():
        ref = model(x)
    assert torch.allclose(out, ref, atol=0.1) if executor == "sim" else torch.equal(out, ref)


def test_input_that_requires_grad_runs_the_partition():
    """numpy() refuses a tensor that requires grad: the feed detaches it (host_array)."""
    model, x = seeded(ConvStack()), torch.randn(1, 3, 16, 16)
    compiled = compile_bpu(model, executor="sim")
    with torch.no_grad():
        plain = compiled(x)
        with_grad = compiled(x.clone().requires_grad_())
    assert torch.equal(plain, with_grad)


def test_host_array_is_a_view_with_or_without_grad():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    view = host_array(t)
    t[0, 0] = 42.0
    assert view[0, 0] == 42.0  # the tensor's memory, not a copy
    g = torch.ones(4, requires_grad=True)
    with pytest.raises(RuntimeError):
        g.numpy()
    arr = host_array(g)
    assert isinstance(arr, np.ndarray) and arr.ctypes.data == g.data_ptr()


def test_host_array_names_what_numpy_refuses():
    """A tensor numpy() cannot view for a reason other than grad (a dtype numpy lacks) is
    refused with torch's own error, not copied or converted behind the caller's back."""
    with pytest.raises((RuntimeError, TypeError)):
        host_array(torch.ones(2, dtype=torch.bfloat16))


def test_module_hooks_on_a_partition_runtime_do_not_run():
    """Documented trade: the graph calls partitions without nn.Module's call machinery."""
    model, x = seeded(ConvStack()), torch.randn(1, 3, 16, 16)
    compiled = compile_bpu(model, executor="sim")
    with report.collect() as reps, torch.no_grad():
        compiled(x)
    part = next(r for g in reps for r in g.runtimes)
    seen = []
    handle = part.register_forward_hook(lambda *a: seen.append(1))
    try:
        with torch.no_grad():
            compiled(x)
    finally:
        handle.remove()
    assert seen == []
    assert isinstance(part, nn.Module)  # still a submodule: named_modules(), explain() see it

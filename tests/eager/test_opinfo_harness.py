"""The peer suite's harness can fail: negative controls for a crash, a hang, a wrong result and
a device that accepts what the CPU refuses, plus a check that every exclusion names a real op."""

from __future__ import annotations

import faulthandler
import os
import signal
from collections.abc import Callable

import torch
from torch.testing._internal.opinfo.core import SampleInput

from tests.eager import opinfo_peer


class FakeOp:
    """The part of an OpInfo the harness uses."""

    variant_test_name = ""

    def __init__(self, name: str, fn: Callable[[torch.Tensor], object]) -> None:
        self.name, self.fn = name, fn

    def supported_dtypes(self, device: str) -> set[torch.dtype]:
        return {torch.float32}

    def sample_inputs(self, device: str, dtype: torch.dtype, requires_grad: bool = False):
        yield SampleInput(torch.arange(4.0, device=device, dtype=dtype))

    def __call__(self, x: torch.Tensor) -> object:
        return self.fn(x)


def _segfault_on_device(x: torch.Tensor) -> torch.Tensor:
    if x.device.type == "flagos":
        faulthandler.disable()  # a real crash's traceback helps; this planned one is noise
        os.kill(os.getpid(), signal.SIGSEGV)
    return x + 1


def _hang_on_device(x: torch.Tensor) -> torch.Tensor:
    if x.device.type == "flagos":
        signal.pause()
    return x + 1


def _wrong_on_device(x: torch.Tensor) -> torch.Tensor:
    return x + (2 if x.device.type == "flagos" else 1)


def _refuse_on_cpu_only(x: torch.Tensor) -> torch.Tensor:
    if x.device.type == "cpu":
        raise RuntimeError("bad input")
    return x


def _run(*ops: FakeOp, timeout: float = 60.0) -> dict[str, opinfo_peer.OpReport]:
    table = {op.name: op for op in ops}
    return opinfo_peer.run_isolated(table, list(table), cap=2, workers=1, timeout=timeout)


def test_a_crash_is_that_ops_failure_and_the_next_op_still_runs() -> None:
    reports = _run(FakeOp("crashes", _segfault_on_device), FakeOp("after", lambda x: torch.sin(x)))
    assert reports["crashes"].crash == "the process died with SIGSEGV"
    assert reports["after"].ok and reports["after"].passed == 1


def test_a_hang_is_killed_and_reported() -> None:
    reports = _run(FakeOp("hangs", _hang_on_device), FakeOp("after", torch.cos), timeout=3.0)
    assert "no result within 3 s" in reports["hangs"].crash
    assert reports["after"].ok


def test_wrong_values_and_accepting_bad_input_are_failures() -> None:
    reports = _run(FakeOp("wrong", _wrong_on_device), FakeOp("lenient", _refuse_on_cpu_only))
    assert reports["wrong"].failures and "wrong result" in reports["wrong"].failures[0]
    assert (
        "the CPU raised RuntimeError but flagos returned a result"
        in (reports["lenient"].failures[0])
    )


def test_a_result_left_on_the_cpu_is_a_failure() -> None:
    reports = _run(FakeOp("leaves", lambda x: x.cpu() + 1))
    assert "result left the device" in reports["leaves"].failures[0]


def test_every_exclusion_names_an_op_of_the_database() -> None:
    ops = opinfo_peer.load_ops()
    for name, (treatment, reason) in opinfo_peer.EXCLUSIONS.items():
        assert name in ops, f"stale exclusion {name!r}"
        assert treatment in (opinfo_peer.SKIP, opinfo_peer.SHAPE_ONLY)
        assert reason, f"exclusion {name!r} needs a reason"

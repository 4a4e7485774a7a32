"""`options={"driver": ...}` chooses the compiler driver, over FLAGOS_BPU_DRIVER.

The compile lane's environment says FLAGOS_BPU_DRIVER=none (tests/compile/conftest.py); an
"x86_64 Python with hbdk4" is the venv Python with the hbdk4 stand-in on its path.
"""

from __future__ import annotations

import stat
import sys

import pytest
import torch
from torch import nn

from tests.compile.bpu_helpers import STANDINS, compile_bpu, runtimes
from torch_fl.bpu import report


@pytest.fixture
def x86_python(tmp_path, monkeypatch):
    py = tmp_path / "x86python"
    py.write_text(
        f'#!/bin/sh\nexport PYTHONPATH={STANDINS / "hbdk4"}\nexec {sys.executable} "$@"\n'
    )
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("FLAGOS_BPU_X86_PYTHON", str(py))
    return py


def _compiled(**options) -> bool:
    """Whether the partition's artifact went through the hbdk4 compiler."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    torch._dynamo.reset()
    with report.collect() as reps, torch.no_grad():
        compile_bpu(model, executor="sim", compile_artifact="always", **options)(
            torch.randn(1, 3, 8, 8)
        )
    (rt,) = runtimes(reps)
    return bool(rt.last_build.compiled)


def test_driver_option_overrides_environment_none(x86_python):
    assert not _compiled()  # FLAGOS_BPU_DRIVER=none: no compiler
    assert _compiled(driver="native", cache=False)


def test_driver_option_none_overrides_environment(x86_python, monkeypatch):
    monkeypatch.setenv("FLAGOS_BPU_DRIVER", "native")
    assert _compiled(cache=False)
    assert not _compiled(driver="none", cache=False)

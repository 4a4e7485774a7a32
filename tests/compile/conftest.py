"""Compile-lane fixtures: an isolated cache and environment per test, Dynamo reset after each."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

BPU_VARS = [k for k in os.environ if k.startswith("FLAGOS_BPU_")]


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    for key in BPU_VARS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("FLAGOS_BPU_ENV_FILE", str(tmp_path / "no-env-file"))
    monkeypatch.setenv("FLAGOS_BPU_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FLAGOS_BPU_DRIVER", "none")
    torch.manual_seed(0)
    # each test starts like a new process with an empty cache: no calibration remembered
    from torch_fl.bpu.conversion.calibration_store import STORE

    STORE.clear_memory()
    yield
    torch._dynamo.reset()


@pytest.fixture
def cache_dir(tmp_path) -> Path:
    return tmp_path / "cache"

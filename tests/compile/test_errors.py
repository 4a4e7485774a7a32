"""Every failure the bpu backend shows a user derives from torch_fl.bpu.BpuError."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import sys
from pathlib import Path

import pytest
import torch

import torch_fl.bpu
from torch_fl.bpu import BpuError

PACKAGE = Path(torch_fl.bpu.__file__).parent
# Scripts that run in the compiler's own interpreter (no torch_fl there): not imported here.
STANDALONE = {"torch_fl.bpu.drivers.hbdk4_guest", "torch_fl.bpu.drivers.hbdk4_worker"}
STANDALONE_FILES = {"hbdk4_guest.py", "hbdk4_worker.py", "watchdog.py"}


def package_modules() -> list[str]:
    found = []
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="torch_fl.bpu."):
        if info.name not in STANDALONE and not info.name.endswith(".watchdog"):
            found.append(info.name)
    return found


def exception_classes() -> dict[str, type[BaseException]]:
    classes = {}
    for name in package_modules():
        module = importlib.import_module(name)
        for cls_name, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__.startswith("torch_fl.bpu"):
                classes[f"{cls.__module__}.{cls_name}"] = cls
    return classes


def test_walk_finds_the_package_errors():
    classes = exception_classes()
    # the walk really reaches the modules that raise (a walk finding nothing would pass below)
    assert len(classes) >= 10
    assert "torch_fl.bpu.errors.QuantizationError" in classes


def test_every_exception_class_derives_from_bpu_error():
    outside = [name for name, cls in exception_classes().items() if not issubclass(cls, BpuError)]
    assert outside == [], f"exception classes not derived from BpuError: {outside}"


@pytest.mark.parametrize(
    ("module", "name", "builtin"),
    [
        ("torch_fl.bpu.settings", "SettingsError", ValueError),
        ("torch_fl.bpu.runtime.partition", "StrictModeError", RuntimeError),
        ("torch_fl.bpu.conversion.export", "ExportError", RuntimeError),
        ("torch_fl.bpu.conversion.qdq", "QuantizationError", RuntimeError),
        ("torch_fl.bpu.cache", "CacheError", OSError),
        ("torch_fl.bpu.drivers", "CompileError", RuntimeError),
        ("torch_fl.bpu.drivers.driver", "CompileError", RuntimeError),
    ],
)
def test_old_import_paths_and_builtin_bases_kept(module, name, builtin):
    cls = getattr(importlib.import_module(module), name)
    assert cls is getattr(importlib.import_module("torch_fl.bpu.errors"), name)
    assert issubclass(cls, BpuError) and issubclass(cls, builtin)


def test_no_bare_runtime_error_raised_in_the_package():
    bare = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in STANDALONE_FILES:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                func = node.exc.func
                if isinstance(func, ast.Name) and func.id in {"RuntimeError", "Exception"}:
                    bare.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert bare == [], f"raise a BpuError subclass instead: {bare}"


def test_calibrate_without_samples_is_a_bpu_error():
    compiled = torch.compile(torch.nn.Linear(4, 4), backend="bpu")
    with pytest.raises(BpuError, match="no samples given") as info:
        torch_fl.bpu.calibrate(compiled, [])
    assert isinstance(info.value, ValueError)


def test_hbm_executor_without_board_is_a_bpu_error(monkeypatch):
    from torch_fl.bpu.runtime.registry import plan_executor
    from torch_fl.bpu.settings import resolve

    monkeypatch.setattr(
        sys.modules[plan_executor.__module__], "hbm_runtime_available", lambda: False
    )
    with pytest.raises(BpuError, match="needs the board runtime") as info:
        plan_executor(resolve({"executor": "hbm"}))
    assert isinstance(info.value, RuntimeError)

"""Deployable bundles (torch_fl/bpu/bundle.py, bundle_run.py): export, load, and run.py on a
board with no torch, against real ONNX Runtime and the stand-ins for hbdk4 and hbm_runtime."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torch_fl.bpu as bpu
from tests.compile.bpu_helpers import STANDINS, cosine
from tests.compile.test_drivers import libhbtl, x86  # noqa: F401  (fixtures: hbdk4 stand-in)
from tests.support.process import run_process
from torch_fl.atomic import sha256_file
from torch_fl.bpu import bundle
from torch_fl.bpu.errors import CalibrationError, ExportError


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 8, 3)
        )

    def forward(self, image):
        return self.body(image)


def _net() -> tuple[nn.Module, torch.Tensor, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = Net().eval()
    gen = torch.Generator().manual_seed(1)
    samples = [torch.randn(1, 3, 24, 24, generator=gen) for _ in range(4)]
    return model, torch.randn(1, 3, 24, 24, generator=gen), samples


def _run_py(
    path: Path, tmp: Path, *extra: str, pythonpath: list[Path] = ()
) -> subprocess.CompletedProcess:
    """run.py in a fresh interpreter where `import torch` fails (a blocker first on the path)."""
    blocker = tmp / "no_torch"
    blocker.mkdir(exist_ok=True)
    (blocker / "torch.py").write_text("raise ImportError('torch is not on this board')\n")
    (blocker / "torch_fl.py").write_text("raise ImportError('torch_fl is not on this board')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, [blocker, *pythonpath]))}
    return run_process([sys.executable, str(path / "run.py"), *extra], env, 120, tmp)


@pytest.mark.board  # deploy on the board: export there, load, and run.py with no torch
def test_export_load_and_run_without_torch(tmp_path: Path) -> None:
    model, x, samples = _net()
    path = bpu.export(model, x, path=tmp_path / "net.bundle", samples=samples, name="net")
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["model"] == "net" and manifest["hbm"] is None and "hbdk4" in manifest["note"]
    assert [i["name"] for i in manifest["inputs"]] == ["image"]  # forward()'s own name
    assert manifest["inputs"][0]["shape"] == [1, 3, 24, 24] and manifest["inputs"][0]["scale"] > 0
    assert manifest["outputs"][0]["shape"] == [1, 8, 22, 22]
    assert manifest["quantization"]["calibration"]["state"] == "calibrated"
    assert set(manifest["files"]) == {"model.onnx", "run.py"}
    for name, digest in manifest["files"].items():
        assert sha256_file(path / name) == digest
    with torch.no_grad():
        ref = model(x)
    loaded = bpu.load(path)
    got = loaded(x)
    assert loaded.runtime == "onnxruntime" and got.shape == ref.shape
    assert cosine(got, ref) > 0.999
    np.save(tmp_path / "x.npy", x.numpy())
    run = _run_py(path, tmp_path, "--input", "image=x.npy", "--output", "out.npz")
    assert run.returncode == 0, run.stderr
    with np.load(tmp_path / "out.npz") as out:
        np.testing.assert_allclose(out["output_0"], got.numpy(), rtol=0, atol=1e-6)
    assert not list(tmp_path.glob(".net.bundle*"))  # no temporary folder left


def test_with_hbdk4_the_bundle_carries_the_hbm_and_runs_on_hbm_runtime(tmp_path, x86) -> None:  # noqa: F811
    x86(emulated=False)
    model, x, samples = _net()
    path = bpu.export(model, x, path=tmp_path / "net.bundle", samples=samples)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["hbm"] == "model.hbm" and "model.hbm" in manifest["files"]
    assert (path / "model.hbm").read_bytes().startswith(b"HBM-STANDIN\n")
    assert manifest["toolchain"]["compiler"].startswith("hbdk4==")
    np.save(tmp_path / "x.npy", x.numpy())
    board = _run_py(path, tmp_path, "--input", "image=x.npy", "--output", "hbm.npz",
                    "--runtime", "hbm_runtime", pythonpath=[STANDINS / "hbm_runtime"])  # fmt: skip
    assert board.returncode == 0 and "(hbm_runtime)" in board.stdout, board.stderr
    host = _run_py(path, tmp_path, "--input", "image=x.npy", "--output", "ort.npz")
    assert host.returncode == 0, host.stderr
    with np.load(tmp_path / "hbm.npz") as a, np.load(tmp_path / "ort.npz") as b:
        np.testing.assert_allclose(a["output_0"], b["output_0"], rtol=0, atol=1e-6)


@pytest.mark.board
def test_corrupt_or_partial_bundle_is_refused_naming_the_file(tmp_path: Path) -> None:
    model, x, samples = _net()
    path = bpu.export(model, x, path=tmp_path / "b", samples=samples)
    onnx_file = path / "model.onnx"
    data = bytearray(onnx_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    onnx_file.write_bytes(bytes(data))
    with pytest.raises(ExportError, match="model.onnx: sha256 differs"):
        bpu.load(path)
    np.save(tmp_path / "x.npy", x.numpy())
    run = _run_py(path, tmp_path, "--input", "image=x.npy")
    assert run.returncode == 2 and "sha256 differs" in run.stderr and "Traceback" not in run.stderr
    onnx_file.unlink()
    with pytest.raises(ExportError, match="model.onnx is missing"):
        bpu.load(path)
    with pytest.raises(ExportError, match="not a torch-fl bundle"):
        bpu.load(tmp_path)


def test_wrong_inputs_are_named(tmp_path: Path) -> None:
    model, x, samples = _net()
    loaded = bpu.load(bpu.export(model, x, path=tmp_path / "b", samples=samples))
    with pytest.raises(ExportError, match=r"shape \[1, 3, 32, 32\].*\[1, 3, 24, 24\]"):
        loaded(torch.randn(1, 3, 32, 32))
    with pytest.raises(ExportError, match="takes 1 input"):
        loaded(x, x)


def test_existing_paths_are_never_clobbered(tmp_path: Path) -> None:
    model, x, samples = _net()
    tmp_path = tmp_path / "work"  # beside the test's artifact cache
    tmp_path.mkdir()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(ExportError, match="not a bundle; nothing was written"):
        bpu.export(model, x, path=mine, samples=samples)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    first = bpu.export(model, x, path=tmp_path / "b", samples=samples)
    before = (first / "manifest.json").read_bytes()
    with pytest.raises(ExportError, match="holds a bundle already"):
        bpu.export(model, x, path=first, samples=samples)
    assert (first / "manifest.json").read_bytes() == before
    with torch.no_grad():
        model.body[0].weight.mul_(2)
    bpu.export(model, x, path=first, samples=samples, overwrite=True)
    assert (first / "manifest.json").read_bytes() != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "mine"]  # no leftovers


def test_interrupted_export_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    model, x, samples = _net()
    tmp_path = tmp_path / "work"
    tmp_path.mkdir()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bundle.shutil, "copyfile", interrupted)
    with pytest.raises(KeyboardInterrupt):
        bpu.export(model, x, path=tmp_path / "b", samples=samples)
    assert list(tmp_path.iterdir()) == []


def test_models_a_bundle_cannot_hold_are_refused(tmp_path: Path) -> None:
    model, x, samples = _net()
    tmp_path = tmp_path / "work"
    tmp_path.mkdir()
    with pytest.raises(CalibrationError, match="no calibration"):
        bpu.export(model, x, path=tmp_path / "b")  # no samples, never calibrated
    with pytest.raises(ExportError, match="training mode"):
        bpu.export(Net().train(), x, path=tmp_path / "b", samples=samples)

    class Glue(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x):
            y = self.conv(x)
            return torch.sort(y.flatten(1), dim=1).values  # sort stays on the CPU

    with pytest.raises(ExportError, match="one BPU partition.*sort"):
        bpu.export(Glue().eval(), x, path=tmp_path / "b", samples=samples)
    with pytest.raises(ExportError, match="nn.Module"):
        bpu.export(lambda t: t, x, path=tmp_path / "b")
    assert list(tmp_path.iterdir()) == []

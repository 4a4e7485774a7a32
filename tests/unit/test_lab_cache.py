"""Board-lab build cache and capability check: cheap logic, no VM, no build."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from scripts import lab
from scripts.lab import cache, kernel
from tests.standins.lab import standin_box64_old as standin


@pytest.fixture
def lab_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_FL_LAB_CACHE", str(tmp_path / "lab"))
    return tmp_path / "lab"


def test_key_changes_with_inputs_and_is_stable():
    a = cache.product_key("kernel", {"page_size": "64k", "config": ["X"]})
    assert a == cache.product_key("kernel", {"config": ["X"], "page_size": "64k"})
    assert a != cache.product_key("kernel", {"page_size": "64k", "config": ["X", "Y"]})
    assert kernel.inputs("16k") != kernel.inputs("64k")


def test_product_is_published_only_when_complete(lab_cache):
    def broken(tmp: Path) -> dict:
        (tmp / "Image").write_text("half")
        raise RuntimeError("build died")

    with pytest.raises(RuntimeError):
        cache.get_or_build("kernel", {"k": 1}, broken)
    assert cache.lookup("kernel", {"k": 1}) is None
    left = [p.name for p in lab_cache.iterdir() if not p.name.endswith(".lock")]
    assert not left, f"an interrupted build left {left} behind"

    calls = []

    def good(tmp: Path) -> dict:
        calls.append(1)
        (tmp / "Image").write_text("ok")
        return {"build_s": 0.1}

    first, built = cache.get_or_build("kernel", {"k": 1}, good)
    again, built_again = cache.get_or_build("kernel", {"k": 1}, good)
    assert (built, built_again) == (True, False) and first == again and calls == [1]
    assert (first / "Image").read_text() == "ok"
    assert cache.metadata(first)["build_s"] == 0.1
    assert cache.clean()[0] and cache.lookup("kernel", {"k": 1}) is None


def test_unknown_page_size_is_refused_with_the_choices():
    ok, why = lab.capability("4k")
    assert not ok and "16k" in why and "64k" in why
    with pytest.raises(kernel.KernelError, match="16k, 64k"):
        kernel.inputs("4k")


def test_capability_names_missing_qemu(monkeypatch, lab_cache):
    real = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name, *a, **k: None if "qemu-system" in name else real(name)
    )
    ok, why = lab.capability("16k")
    assert not ok and "qemu-system-aarch64" in why and "apt-get install" in why
    assert lab.available() is False


@pytest.mark.skipif(
    shutil.which(standin.CROSS_CC) is None or shutil.which("qemu-aarch64-static") is None,
    reason="needs gcc-aarch64-linux-gnu and qemu-user-static",
)
def test_standin_old_box64_aborts_on_large_pages(tmp_path):
    exe = standin.build_old_box64(tmp_path)
    ver = subprocess.run(["qemu-aarch64-static", str(exe), "-v"], capture_output=True, text=True)
    assert ver.returncode == 0 and "v0.2.6" in ver.stdout and "stand-in" in ver.stdout
    # qemu-user reports (but does not enforce) a 64 KB page size: enough for this logic.
    run = subprocess.run(
        ["qemu-aarch64-static", "-p", "65536", str(exe), "/bin/true"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 255
    assert (
        "Error: PageSize configuration is wrong: configured with 4096, but got 65536" in run.stdout
    )

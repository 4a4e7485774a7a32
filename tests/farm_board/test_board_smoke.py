"""What a provisioned board says about itself, checked on the board (no torch needed)."""

from __future__ import annotations

import importlib.util
import mmap
import os
import platform
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MIN_BOX64 = (0, 4, 0)


def _envfile():
    # By file path: importing the torch_fl package would import torch, which a board running
    # only this lane need not have.
    spec = importlib.util.spec_from_file_location(
        "_board_envfile", REPO / "torch_fl" / "envfile.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_page_size_is_the_kernels():
    getconf = int(subprocess.check_output(["getconf", "PAGESIZE"], text=True))
    assert getconf in (4096, 16384, 65536)
    assert os.sysconf("SC_PAGE_SIZE") == getconf == mmap.PAGESIZE
    if platform.machine() == "x86_64":
        assert getconf == 4096


def test_provisioning_left_its_env_file():
    envfile = _envfile()
    values = envfile.load_env_file()
    assert values, f"no env file at {envfile.env_file_path()}: provision this board first"
    assert values.get("FLAGOS_BPU_MARCH"), values
    assert values.get("FLAGOS_BPU_CACHE"), values


def test_box64_only_where_it_belongs():
    values = _envfile().load_env_file()
    emulator = values.get("FLAGOS_BPU_EMULATOR")
    if platform.machine() != "aarch64":
        # box64 registers itself for x86_64 binaries: on an x86_64 board it must never appear.
        assert emulator is None, emulator
        return
    assert emulator and os.access(emulator, os.X_OK), f"FLAGOS_BPU_EMULATOR={emulator!r}"
    proc = subprocess.run([emulator, "-v"], capture_output=True, text=True, timeout=60)
    found = re.search(r"v(\d+)\.(\d+)\.(\d+)", proc.stdout + proc.stderr)
    assert found, proc.stdout + proc.stderr
    assert tuple(int(x) for x in found.groups()) >= MIN_BOX64, found.group(0)

"""hbdk4 wheel handling: hashing the OE wheels and splitting their requirements.

Under box64, real numba (llvmlite's JIT) segfaults and torch costs hundreds of MB, yet hbdk4
imports both at module scope (numba for a path standard ONNX graphs never call, torch for
isinstance checks). So on emulated targets those are served by import shims
(torch_fl/bpu/drivers/hbdk4_guest.py) and everything else hbdk4 requires is installed for real.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

from provision.artifacts import sha256_of
from provision.floor import light

# Served by the import shims of torch_fl/bpu/drivers/hbdk4_guest.py, so never installed.
SHIMMED = set(light.load("bpu.drivers.hbdk4_guest").SHIMMED)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def list_wheels(directory: Path) -> dict[str, str]:
    """{file name: sha256} of every wheel in --oe-wheels."""
    if not directory.is_dir():
        raise ValueError(f"--oe-wheels {directory} is not a directory of .whl files")
    # Regular files only: a FIFO named x.whl would hang the hashing read.
    found = {p.name: sha256_of(p) for p in sorted(directory.glob("*.whl")) if p.is_file()}
    if not found:
        raise ValueError(f"--oe-wheels {directory} holds no .whl files; point it at the OE wheels")
    return found


def wheel_project(filename: str) -> str:
    return normalize(filename.split("-", 1)[0])


def requires_dist(wheel: Path) -> list[str]:
    """The Requires-Dist lines of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode("utf-8", "replace")
    return [
        ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Requires-Dist:")
    ]


def split_requirements(reqs: list[str], provided: set[str]) -> tuple[list[str], list[str]]:
    """(to install, shimmed) from Requires-Dist lines; drops extras-only and locally provided."""
    install, shimmed = [], []
    for req in reqs:
        if "extra ==" in req.replace('"', "").replace("'", ""):
            continue
        name = normalize(re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0])
        if name in provided:
            continue
        (shimmed if name in SHIMMED else install).append(req)
    return install, shimmed

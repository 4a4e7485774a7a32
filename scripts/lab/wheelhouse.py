"""The emulated board's wheelhouse: aarch64 wheels for its Python, for `--artifacts`.

The guest has no network, as an offline board has none: what pip installs there comes from a
directory of wheels passed with `invoke provision --artifacts` (docs/provisioning.md). This
product holds, for the image's Python (sid's 3.14 on the `torch` image), the wheels provisioning
pins for the board's environment (`torch_env.wheels`) and what the board's lanes need
(requirements-board.txt), each with its dependencies, downloaded here by pip for
manylinux aarch64. torch is not among them: that image has Debian's.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from scripts.lab.cache import get_or_build

REPO = Path(__file__).resolve().parents[2]
BOARD_REQUIREMENTS = REPO / "requirements-board.txt"
# Newest first: pip takes any of them; onnxruntime's aarch64 wheels are manylinux_2_28.
PLATFORMS = ("manylinux_2_28_aarch64", "manylinux_2_27_aarch64", "manylinux_2_26_aarch64",
             "manylinux2014_aarch64", "manylinux_2_17_aarch64")  # fmt: skip


class WheelhouseError(RuntimeError):
    """pip could not download a wheel set; the message has pip's own reason and the fix."""


def requirements(path: Path = BOARD_REQUIREMENTS) -> list[str]:
    """The pins of a requirements file (comments and blank lines dropped)."""
    lines = (ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines())
    return [ln for ln in lines if ln]


def python_version(debian_version: str) -> str:
    """`3.14.8-1` (Debian's python3 package) -> `3.14`."""
    match = re.match(r"(\d+)\.(\d+)", debian_version)
    if match is None:
        raise WheelhouseError(f"cannot read a Python version from {debian_version!r}")
    return f"{match.group(1)}.{match.group(2)}"


def inputs(python: str, pins: list[str]) -> dict[str, Any]:
    return {"python": python, "platforms": list(PLATFORMS), "pins": sorted(pins)}


def _download(product: Path, python: str, pins: list[str]) -> dict[str, Any]:
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q",
            "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
            *[f"--platform={p}" for p in PLATFORMS], "-d", str(product), *pins]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise WheelhouseError(
            f"pip download for Python {python} aarch64 failed (rc {proc.returncode}): "
            f"{proc.stderr.strip()[-1500:]}\nfix: check that the package index is reachable and "
            "that every pin has an aarch64 wheel for that Python"
        )
    return {"wheels": sorted(p.name for p in product.glob("*.whl"))}


def ensure(python: str, pins: list[str]) -> Path:
    """The cached wheelhouse directory for this Python and these pins, downloaded if missing."""
    product, _ = get_or_build(
        "wheelhouse", inputs(python, pins), lambda tmp: _download(tmp, python, pins)
    )
    return product


def for_image(image_meta: dict[str, Any]) -> tuple[Path, str]:
    """(wheelhouse, Python version) for a built image (its product.json): provisioning's pins
    for the board's environment plus requirements-board.txt, for the image's Python."""
    from provision import config

    python = python_version(image_meta.get("versions", {}).get("python3", ""))
    return ensure(python, [*config.load().torch_env.wheels, *requirements()]), python

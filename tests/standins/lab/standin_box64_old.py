"""STAND-IN, tests only: build the stand-in old box64 (standin_box64_old.c) for the guest.

Used only by the board lab's negative test; product code never ships or runs it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("standin_box64_old.c")
CROSS_CC = "aarch64-linux-gnu-gcc"


def build_old_box64(out_dir: Path) -> Path:
    """Compile the stand-in as a static aarch64 binary; return its path."""
    if shutil.which(CROSS_CC) is None:
        raise RuntimeError(f"{CROSS_CC} is missing; fix: apt-get install gcc-aarch64-linux-gnu")
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / "box64-standin-old"
    subprocess.run([CROSS_CC, "-O2", "-static", "-o", str(out), str(SOURCE)], check=True)
    return out

"""Register qemu-user for aarch64 ELF files so mmdebstrap can run the arm64 maintainer scripts.

Registered under a private name (so a distro's own `qemu-aarch64` entry is never touched) with
the F flag (the interpreter is opened now, so it works inside the chroot). Never registers
anything for x86_64 files: on an x86_64 host that would route every program through an emulator.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path

BINFMT = Path("/proc/sys/fs/binfmt_misc")
NAME = "torch-fl-lab-aarch64"
_MAGIC = r"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00"
_MASK = r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff"


class BinfmtError(RuntimeError):
    pass


def qemu_user() -> str | None:
    return shutil.which("qemu-aarch64-static")


def aarch64_registered() -> bool:
    """True when some enabled binfmt entry already handles aarch64 ELF files."""
    if not (BINFMT / "register").exists():
        return False
    for entry in BINFMT.iterdir():
        if entry.name in ("register", "status"):
            continue
        try:
            text = entry.read_text()
        except OSError:
            continue
        if text.startswith("enabled") and "b7" in text and "7f454c46020101" in text:
            return True
    return False


def can_register() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "building the lab root file system needs root (mmdebstrap --mode=root)"
    if qemu_user() is None:
        return False, "qemu-aarch64-static is missing (apt-get install qemu-user-static)"
    if not BINFMT.is_dir():
        return False, "the kernel has no binfmt_misc (needed to run arm64 programs in mmdebstrap)"
    return True, ""


# Two images built side by side (`invoke lab.build`) both come here first: one registers, the
# other waits and finds it registered (a second write of the rule fails with EEXIST).
_REGISTERING = threading.Lock()


def ensure_aarch64() -> None:
    with _REGISTERING:
        _ensure_aarch64()


def _ensure_aarch64() -> None:
    if aarch64_registered():
        return
    ok, why = can_register()
    if not ok:
        raise BinfmtError(why)
    if not (BINFMT / "register").exists():
        subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], check=True)
    if (BINFMT / NAME).exists():
        (BINFMT / NAME).write_text("1")
        return
    rule = f":{NAME}:M::{_MAGIC}:{_MASK}:{qemu_user()}:F"
    (BINFMT / "register").write_text(rule)
    if not aarch64_registered():
        raise BinfmtError(f"registering {NAME} in {BINFMT} did not take effect")

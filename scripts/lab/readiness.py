"""Whether the board lab can start on this machine, and why not.

`capability()` is cheap (no build, no boot): it says whether `up()` can work on this machine,
either from cached build products or by building them, and if not, why.
"""

from __future__ import annotations

import os
import shutil

DEFAULT_PAGE_SIZE = os.environ.get("TORCH_FL_LAB_PAGE_SIZE", "64k")


def capability(page_size: str | None = None, image: str = "board") -> tuple[bool, str]:
    """(available, reason): can a lab with this page size, booting this image, start here?"""
    # Imported here: the check must stay cheap for the many callers that never build a lab.
    from scripts.lab.binfmt import aarch64_registered, can_register
    from scripts.lab.images import IMAGES
    from scripts.lab.kernel import PAGE_SIZES
    from scripts.lab.kernel import cached as kernel_cached
    from scripts.lab.rootfs import cached as rootfs_cached

    page_size = page_size or DEFAULT_PAGE_SIZE
    if page_size not in PAGE_SIZES:
        return False, f"page size {page_size!r} is not one of {', '.join(PAGE_SIZES)}"
    if image not in IMAGES:
        return False, f"lab image {image!r} is not one of {', '.join(sorted(IMAGES))}"
    if shutil.which("qemu-system-aarch64") is None:
        return False, "qemu-system-aarch64 is missing (apt-get install qemu-system-arm)"
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return False, "ssh/ssh-keygen are missing (apt-get install openssh-client)"
    missing: list[str] = []
    if kernel_cached(page_size) is None:
        tools = ["dpkg-deb", "apt-get"]
        if page_size == "64k":
            tools += ["make", "gcc", "aarch64-linux-gnu-gcc", "flex", "bison", "bc"]
        else:
            tools += ["depmod"]
        missing += [tool for tool in tools if shutil.which(tool) is None]
    if rootfs_cached(image) is None:
        missing += [
            t
            for t in ("mmdebstrap", "arch-test", "cpio", "dpkg-scanpackages")
            if shutil.which(t) is None
        ]
        if not aarch64_registered():
            ok, why = can_register()
            if not ok:
                return False, why
    if missing:
        return False, "not cached and cannot be built: missing " + ", ".join(sorted(set(missing)))
    return True, "ok"


def available() -> bool:
    """Boolean form of capability() for the test-matrix capability detector."""
    return capability()[0]

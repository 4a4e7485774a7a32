"""The lab's root file system images: what userland each emulated board boots.

- `board`: Debian trixie arm64 with amd64 multi-arch. It has trixie's box64 0.3.4, which
  provisioning must judge too old and upgrade, and an x86_64 Python for hbdk4. The box64 /
  page-size lanes run on it.
- `torch`: Debian sid arm64, with sid's `python3-torch` (2.14.1 today) and a C++ toolchain.
  PyPI's aarch64 torch is a CUDA build, so sid's package is the one aarch64 CPU torch reachable
  here. It cannot join the trixie image: sid's libc6 and the amd64 libc6 that trixie's box64
  libraries need are different versions, and multi-arch copies must match. So torch-fl is
  built, imported and tested on this image (the board-torch lane), and box64 is tested on the
  other.

The kernel and the CPU model are the same for both: the boards' Cortex-A78AE is ARMv8.2 with
dot product and no SVE, which `neoverse-n1` matches. `max` would hand torch and ONNX Runtime
SVE2 kernels that no RDK board has.
"""

from __future__ import annotations

from dataclasses import dataclass

CPU_MODEL = "neoverse-n1"

# What every image needs to be a provisioning target without systemd (the lab boots its own
# /init; sysusers without the whole of systemd saves minutes of emulated maintainer scripts).
_BASE = [
    "openssh-server",
    "systemd-standalone-sysusers",
    "ca-certificates",  # pip (Debian's build) loads the system CA bundle even for local wheels
    "python3",
]
_TOOLS = ["iproute2", "tini", "kmod", "procps", "file", "xz-utils"]


@dataclass(frozen=True)
class Image:
    """One root file system recipe and the VM it needs."""

    name: str
    suite: str
    # The first is the native one; more are multi-arch foreign architectures.
    architectures: tuple[str, ...]
    packages: tuple[str, ...]
    # The offline apt repository inside the image: (suite, native arch, packages, closure?)
    repo_sets: tuple[tuple[str, str, tuple[str, ...], bool], ...]
    memory_mb: int
    doc: str
    # Debian byte-compiles every Python package it installs. Under qemu-user that is most of a
    # cold build for torch's, sympy's and networkx's thousands of files; without it, the guest
    # compiles what it imports on first use instead (into its RAM file system, once a boot).
    byte_compile: bool = True


BOARD = Image(
    name="board",
    suite="trixie",
    architectures=("arm64", "amd64"),
    packages=(
        *_BASE,
        "box64",  # trixie: 0.3.4, which provisioning must judge too old and upgrade
        *_TOOLS,
        "libgcc-s1:amd64",
        "libstdc++6:amd64",
    ),
    repo_sets=(
        ("sid", "arm64", ("box64",), False),
        ("trixie", "amd64", ("python3.13-minimal", "libpython3.13-stdlib", "libpython3.13"), True),
    ),
    memory_mb=3072,
    doc="trixie arm64 + amd64: box64 0.3.4 to upgrade, the x86_64 Python for hbdk4",
)

TORCH = Image(
    name="torch",
    suite="sid",
    architectures=("arm64",),
    packages=(
        *_BASE,
        # /init mounts /proc, /sys and /dev/pts: trixie pulls util-linux's mount in, sid does not
        # (without it torch finds no /proc/cpuinfo and no CPU devices in /sys).
        "mount",
        "python3-venv",
        # torch-fl builds on the board: the compiler, Python.h, torch's C++ headers (Debian
        # keeps them in libtorch-dev, under /usr/include) and pybind11 (Debian's torch does not
        # bundle it).
        "g++",
        "python3-dev",
        "pybind11-dev",
        "python3-torch",
        "libtorch-dev",
        *_TOOLS,
    ),
    repo_sets=(),
    # The root file system lives in RAM (an initramfs): torch and its libraries take about
    # 1.5 GB there, and two compilers against torch's headers need about 1 GB each.
    memory_mb=8192,
    doc="sid arm64 with Debian's python3-torch and a C++ toolchain: torch-fl built and tested",
    byte_compile=False,
)

IMAGES = {image.name: image for image in (BOARD, TORCH)}
DEFAULT = BOARD.name


def image(name: str) -> Image:
    """The image of that name; an unknown name raises with the known ones."""
    try:
        return IMAGES[name]
    except KeyError:
        raise ValueError(
            f"unknown lab image {name!r}; use one of: {', '.join(sorted(IMAGES))}"
        ) from None

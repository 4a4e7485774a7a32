"""Named capability profiles, forced with `--platform NAME` for dry runs.

A profile answers "what would the matrix do on that machine?" without being on it: which lanes
run, which are listed as not run and why, and which expectations are active. Values mirror what
`capabilities.detect()` reports on the real machine (see docs/matrix.md and the RDK fact sheet).
"""

from __future__ import annotations

from typing import Any

_BASE: dict[str, Any] = {
    "arch": "x86_64",
    "page_size": 4096,
    "ucp": False,
    "bpu_cores": 0,
    "hbdk4": "none",
    "box64": None,
    "libcupti": False,
    "cuda_device": False,
    "sshd": False,
    "qemu_system_aarch64": False,
    "lab": False,
    "torch_fl_ext": True,
    "ruff": "0.0.0",
    "xdist": True,
}

PROFILES: dict[str, dict[str, Any]] = {
    # CI: clean x86_64 clone; .ci/run installs sshd; hbdk4 is vendor-only so not on CI.
    "x86-ci": {**_BASE, "sshd": True},
    # Developer workstation with the vendor OE package and the emulated board lab.
    "x86-dev": {
        **_BASE,
        "hbdk4": "native",
        "sshd": True,
        "qemu_system_aarch64": True,
        "lab": True,
    },
    # RDK S100: A78AE, one BPU core (nash-e), hbdk4 only under box64. The page size of its
    # 6.1-rt kernel is unconfirmed; 4 KB here, the real value comes from detection on the board.
    "rdk-s100": {
        **_BASE,
        "arch": "aarch64",
        "ucp": True,
        "bpu_cores": 1,
        "hbdk4": "emulated",
        "box64": "0.4.5",
        "sshd": True,
    },
    # RDK S600: nash-p with 4 BPU cores on a 64 KB-page kernel.
    "rdk-s600": {
        **_BASE,
        "arch": "aarch64",
        "page_size": 65536,
        "ucp": True,
        "bpu_cores": 4,
        "hbdk4": "emulated",
        "box64": "0.4.5",
        "sshd": True,
    },
    # The lent GPU host: CUDA 13 + CUPTI, no sshd, no vendor tools.
    "gpu-host": {**_BASE, "libcupti": True, "cuda_device": True},
}


def profile(name: str) -> dict[str, Any]:
    """Capabilities of a named platform; unknown names raise with the list of valid ones."""
    try:
        return dict(PROFILES[name])
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise KeyError(f"unknown platform {name!r}; use one of: {known}") from None

"""box64 decisions as pure functions of observed text and facts (unit-testable without a board).

Version strings moved between releases (stdout vs stderr, `[BOX64] ` prefix, arch word before
the version), so parsing reads both streams and anchors on the `vX.Y.Z` token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

Version = tuple[int, int, int]

_VERSION_RE = re.compile(r"\bv(\d+)\.(\d+)\.(\d+)\b")
_DEB_VERSION_RE = re.compile(r"^(?:\d+:)?(\d+)\.(\d+)(?:\.(\d+))?")
PAGESIZE_ABORT = "PageSize configuration is wrong"


def parse_version(stdout: str, stderr: str = "") -> Version | None:
    """The box64 version from `box64 -v` output in any known format, or None.

    Lines that mention box64 are preferred so an unrelated `v1.2.3` elsewhere cannot win.
    """
    text = f"{stdout}\n{stderr}"
    lines = text.splitlines()
    preferred = [ln for ln in lines if "box64" in ln.lower()]
    for line in preferred + lines:
        match = _VERSION_RE.search(line)
        if match:
            return (int(match[1]), int(match[2]), int(match[3]))
    return None


def parse_policy(text: str) -> Version:
    """Parse a policy version like "0.4.0" (a leading v is accepted)."""
    match = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)", text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a version like 0.4.0; write it as MAJOR.MINOR.PATCH")
    return (int(match[1]), int(match[2]), int(match[3]))


def fmt(version: Version | None) -> str:
    return "none" if version is None else ".".join(str(p) for p in version)


def meets_policy(found: Version | None, minimum: Version) -> bool:
    return found is not None and found >= minimum


def parse_deb_version(text: str) -> Version | None:
    """Upstream part of a Debian version: "0.4.3+dfsg-1" -> (0, 4, 3)."""
    match = _DEB_VERSION_RE.match(text.strip())
    if not match:
        return None
    return (int(match[1]), int(match[2]), int(match[3] or 0))


def parse_apt_policy(text: str) -> tuple[str | None, str | None]:
    """(installed, candidate) from `apt-cache policy PKG`; "(none)" becomes None."""
    installed = candidate = None
    for line in text.splitlines():
        key, _, value = line.strip().partition(":")
        value = value.strip()
        if key == "Installed":
            installed = None if value == "(none)" else value
        elif key == "Candidate":
            candidate = None if value == "(none)" else value
    return installed, candidate


def parse_libc_requirement(apt_show: str) -> Version | None:
    """The glibc a package needs, from the `Depends:` line of `apt-cache show`."""
    for line in apt_show.splitlines():
        if line.startswith(("Depends:", "Pre-Depends:")):
            match = re.search(r"libc6\s*\(>=\s*([0-9.]+)", line)
            if match:
                parts = [int(p) for p in match[1].split(".")[:3]]
                return tuple((parts + [0, 0, 0])[:3])  # type: ignore[return-value]
    return None


def parse_glibc(text: str) -> Version | None:
    """From `getconf GNU_LIBC_VERSION` ("glibc 2.36") or a bare "2.36"."""
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not match:
        return None
    return (int(match[1]), int(match[2]), int(match[3] or 0))


@dataclass(frozen=True)
class InstallDecision:
    kind: str  # "none" | "distro" | "source"
    reason: str


def decide_install(
    found: Version | None,
    minimum: Version,
    *,
    candidate: str | None,
    libc_needed: Version | None,
    glibc: Version | None,
    allow_distro: bool = True,
) -> InstallDecision:
    """Keep, install the distro package, or build the pinned release from source."""
    if meets_policy(found, minimum):
        return InstallDecision("none", f"box64 {fmt(found)} satisfies >= {fmt(minimum)}")
    why = "missing" if found is None else f"{fmt(found)} is older than {fmt(minimum)}"
    if not allow_distro:
        return InstallDecision("source", f"box64 {why}; distro packages disabled by config")
    if candidate is None:
        return InstallDecision("source", f"box64 {why}; the package manager offers no box64")
    cand = parse_deb_version(candidate)
    if not meets_policy(cand, minimum):
        return InstallDecision(
            "source", f"box64 {why}; distro candidate {candidate} is older than {fmt(minimum)}"
        )
    if libc_needed is not None and (glibc is None or glibc < libc_needed):
        return InstallDecision(
            "source",
            f"box64 {why}; distro candidate {candidate} needs glibc >= {fmt(libc_needed)}, "
            f"target has {fmt(glibc)}",
        )
    return InstallDecision("distro", f"box64 {why}; installing distro package {candidate}")


def build_jobs(cpus: int, mem_mb: int, mb_per_job: int = 1500) -> int:
    """Parallel compile jobs bounded by memory: a low-memory board must not swap or OOM."""
    by_mem = max(1, mem_mb // max(1, mb_per_job))
    return max(1, min(max(1, cpus), by_mem))


def cmake_args(extra: list[str]) -> list[str]:
    return ["-DARM_DYNAREC=ON", "-DCMAKE_BUILD_TYPE=RelWithDebInfo", *extra]


def may_install_on(arch: str) -> bool:
    """box64 is only ever installed on aarch64: on x86_64 its binfmt rule would hijack every
    host program."""
    return arch in ("aarch64", "arm64")

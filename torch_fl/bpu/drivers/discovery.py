"""Find the hbdk4 compiler: in this interpreter, in an x86_64 Python, or under an emulator.

Decision (driver `auto`; the driver is `BpuSettings.driver`, else FLAGOS_BPU_DRIVER):
1. hbdk4 importable by this interpreter on x86_64            -> native, this interpreter
2. FLAGOS_BPU_X86_PYTHON set and this machine is x86_64       -> native, that interpreter
3. FLAGOS_BPU_X86_PYTHON + FLAGOS_BPU_EMULATOR on non-x86_64  -> emulated (box64)
4. otherwise                                                  -> none
Driver native|emulated|none forces a kind (tests use it to run the emulated path on
x86_64 with a stand-in emulator). The result is cached per process and per configuration;
`discover(refresh=True)` probes again. The probe reads the installed version through
importlib.metadata in the target interpreter and never imports hbdk4, so it stays cheap.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass

from torch_fl import envfile

PROBE = (
    "import importlib.metadata as m, importlib.util as u\n"
    "spec = u.find_spec('hbdk4')\n"
    "v = None\n"
    "for d in ('hbdk4-compiler', 'hbdk4_compiler', 'hbdk4'):\n"
    "    try:\n"
    "        v = m.version(d); break\n"
    "    except Exception:\n"
    "        pass\n"
    "print('HBDK4_PROBE', 'yes' if spec else 'no', v or 'unknown')\n"
)


@dataclass(frozen=True)
class CompilerInfo:
    """What `discover` found. `kind` is native, emulated or none."""

    kind: str
    version: str | None = None
    python: str | None = None
    emulator: str | None = None
    guest_libs: str | None = None
    detail: str = ""

    @property
    def compiler_id(self) -> str:
        return f"hbdk4=={self.version}" if self.kind != "none" else "none"


_CACHE: dict[tuple, CompilerInfo] = {}


def _config(driver: str | None) -> tuple:
    return (
        (driver or envfile.get("FLAGOS_BPU_DRIVER") or "auto").lower(),
        envfile.get("FLAGOS_BPU_X86_PYTHON") or "",
        envfile.get("FLAGOS_BPU_EMULATOR") or "",
        envfile.get("FLAGOS_BPU_GUEST_LIBS") or "",
        platform.machine(),
    )


def clean_env(guest_libs: str | None, emulated: bool) -> dict[str, str]:
    """The environment the compiler runs in: nothing from the host's Python setup leaks in."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/tmp"),
        "LANG": "C.UTF-8",
        "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
        "PYTHONNOUSERSITE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if emulated:
        env.update({"BOX64_NOBANNER": "1", "BOX64_LOG": "0"})
        if guest_libs:
            env["BOX64_LD_LIBRARY_PATH"] = guest_libs
    if guest_libs:
        env["LD_LIBRARY_PATH"] = guest_libs
    return env


def _probe(python: str, emulator: str | None, guest_libs: str | None) -> tuple[bool, str, str]:
    cmd = ([emulator] if emulator else []) + [python, "-c", PROBE]
    try:
        proc = subprocess.run(
            cmd,
            env=clean_env(guest_libs, bool(emulator)),
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, "", f"probe of {python} failed: {exc}"
    for line in reversed(proc.stdout.splitlines()):
        parts = line.split()
        if len(parts) == 3 and parts[0] == "HBDK4_PROBE":
            if parts[1] == "yes":
                return True, parts[2], ""
            return False, "", f"{python} has no hbdk4 (install the OE hbdk4 wheels into it)"
    return (
        False,
        "",
        f"probe of {python} printed no marker (rc={proc.returncode}): {proc.stderr[-300:]}",
    )


def _discover(config: tuple) -> CompilerInfo:
    forced, x86_python, emulator, guest_libs, machine = config
    guest = guest_libs or None
    if forced == "none":
        return CompilerInfo("none", detail="driver none (FLAGOS_BPU_DRIVER=none or options)")
    is_x86 = machine in ("x86_64", "AMD64")
    if forced in ("auto", "native") and not x86_python and is_x86:
        if importlib.util.find_spec("hbdk4") is not None:
            from importlib import metadata

            version = "unknown"
            for dist in ("hbdk4-compiler", "hbdk4_compiler", "hbdk4"):
                try:
                    version = metadata.version(dist)
                    break
                except metadata.PackageNotFoundError:
                    continue
            return CompilerInfo("native", version, sys.executable, None, guest)
    if not x86_python:
        return CompilerInfo(
            "none",
            detail="no hbdk4 in this Python and FLAGOS_BPU_X86_PYTHON is not set "
            "(run `invoke provision` or compile on an x86_64 host with `invoke compile-host`)",
        )
    use_emulator = forced == "emulated" or (forced == "auto" and not is_x86)
    if use_emulator:
        if not emulator:
            return CompilerInfo(
                "none",
                detail="FLAGOS_BPU_X86_PYTHON needs FLAGOS_BPU_EMULATOR (box64) on this machine",
            )
        emulator_path = shutil.which(emulator) or emulator
        ok, version, detail = _probe(x86_python, emulator_path, guest)
        kind = "emulated"
    else:
        emulator_path = None
        ok, version, detail = _probe(x86_python, None, guest)
        kind = "native"
    if not ok:
        return CompilerInfo("none", detail=detail)
    return CompilerInfo(kind, version, x86_python, emulator_path, guest)


def discover(refresh: bool = False, driver: str | None = None) -> CompilerInfo:
    """The compiler available to this process (cached per configuration).

    `driver` is the compilation's `BpuSettings.driver`; without it FLAGOS_BPU_DRIVER decides.
    """
    config = _config(driver)
    if refresh or config not in _CACHE:
        _CACHE[config] = _discover(config)
    return _CACHE[config]

"""Detect what this machine can do; lanes and expectations are keyed on these values.

Everything here is *probed* (a library really loads, a binary really runs) rather than declared, so
a matrix run on a new machine tells the truth about it. Probes that could crash or hang (vendor
runtime, compiler discovery that imports torch) run in a child interpreter with a timeout so a bad
driver can never take the runner down with it.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from provision import box64
from provision.floor import light

REPO_ROOT = Path(__file__).resolve().parents[2]

# name -> one-line meaning; schema.py rejects requirement names not listed here.
CAPABILITIES: dict[str, str] = {
    "arch": "machine architecture (x86_64, aarch64)",
    "page_size": "kernel page size in bytes",
    "ucp": "board runtime libhbucp loadable (FLAGOS_BPU_UCP_LIB or /usr/hobot/lib)",
    "bpu_cores": "BPU cores reported by hb_bpu_core_num() (0: no driver)",
    "hbdk4": "hbdk4 compiler driver: native, emulated or none",
    "box64": "box64 version (x.y.z) or none",
    "libcupti": "NVIDIA CUPTI library loadable",
    "cuda_device": "a CUDA device answers cuDeviceGetCount() > 0",
    "sshd": "an OpenSSH server binary (for the provision lane's loopback sshd)",
    "qemu_system_aarch64": "qemu-system-aarch64 on PATH",
    "lab": "the emulated board lab can run (qemu-system-aarch64 + scripts/lab)",
    "torch_fl_ext": "the torch_fl._C extension is built",
    "ruff": "ruff version or none",
    "xdist": "pytest-xdist importable",
}

_SEMVER = re.compile(r"v?(\d+\.\d+\.\d+)")


def _loadable(path: str) -> bool:
    try:
        ctypes.CDLL(path)
    except OSError:
        return False
    return True


def _read_env_setting(name: str) -> str | None:
    """FLAGOS_BPU_* from the environment, then the provisioning env file.

    torch_fl/envfile.py is loaded by file path (provision/light.py): importing the `torch_fl`
    package would import torch and the C++ extension, which the runner must not depend on.
    """
    if os.environ.get(name):
        return os.environ[name]
    try:
        return light.load("envfile").load_env_file().get(name) or None
    except (OSError, ValueError):
        return None


def _run_probe(
    code: str, timeout: float, env: dict[str, str] | None = None, cwd: Path = REPO_ROOT
) -> dict[str, Any]:
    """Run `code` in a fresh interpreter; it must print one JSON object as its last line."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            env={**os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired:
        return {"error": f"probe timed out after {timeout:.0f}s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or [f"rc={proc.returncode}"])[-1]
        return {"error": tail[:200]}
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError:
        return {"error": f"probe printed {lines[-1][:80]!r}"}


def ucp_library() -> str | None:
    """Path of a libhbucp that really loads, or None."""
    candidates = [_read_env_setting("FLAGOS_BPU_UCP_LIB"), "/usr/hobot/lib/libhbucp.so"]
    for cand in candidates:
        if cand and Path(cand).is_file() and _loadable(cand):
            return cand
    return None


_CORES_PROBE = """
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1] if len(sys.argv) > 1 else {lib!r}, mode=ctypes.RTLD_GLOBAL)
fn = getattr(lib, "hb_bpu_core_num", None)
print(json.dumps({{"cores": int(fn()) if fn is not None else 0}}))
"""


def bpu_cores(lib: str | None) -> int:
    # The vendor call runs in a child: a broken driver may abort, and must not abort the runner.
    if lib is None:
        return 0
    out = _run_probe(_CORES_PROBE.format(lib=lib), timeout=15)
    return max(0, int(out.get("cores", 0)))


_HBDK4_PROBE = """
import json
from torch_fl.bpu import drivers
d = drivers.discover()
print(json.dumps({"kind": str(d.kind), "version": str(getattr(d, "version", "") or "")}))
"""


def hbdk4_driver(root: Path = REPO_ROOT) -> dict[str, str]:
    """{"kind": native|emulated|none, "version": ..., "note": why none}; tolerant of absence."""
    bpu = root / "torch_fl" / "bpu"
    if not (bpu / "drivers.py").is_file() and not (bpu / "drivers").is_dir():
        return {"kind": "none", "version": "", "note": "torch_fl.bpu.drivers not present"}
    # Imported in a child: it imports torch_fl (torch + the C++ extension), which may be unbuilt.
    out = _run_probe(_HBDK4_PROBE, timeout=60, env={"PYTHONPATH": str(root)}, cwd=root)
    if "error" in out:
        return {"kind": "none", "version": "", "note": out["error"]}
    kind = out.get("kind", "none")
    if kind not in ("native", "emulated", "none"):
        return {"kind": "none", "version": "", "note": f"discover() returned kind {kind!r}"}
    return {"kind": kind, "version": out.get("version", ""), "note": ""}


def box64_version() -> str | None:
    """Version of the emulator; `box64 -v` prints on stdout or stderr depending on release."""
    exe = _read_env_setting("FLAGOS_BPU_EMULATOR") or shutil.which("box64")
    if not exe or not os.access(exe, os.X_OK):
        return None
    try:
        proc = subprocess.run([exe, "-v"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    version = box64.parse_version(proc.stdout, proc.stderr)
    return box64.fmt(version) if version is not None else None


def _cupti_candidates() -> list[str]:
    names = ["libcupti.so", "libcupti.so.13", "libcupti.so.12", "libcupti.so.11.8"]
    dirs = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    paths = [f"{d}/extras/CUPTI/lib64/libcupti.so" for d in dirs if d]
    # pip-installed CUDA (torch's nvidia-* wheels) puts CUPTI inside site-packages.
    for entry in sys.path:
        paths += sorted(glob.glob(f"{entry}/nvidia/cuda_cupti/lib/libcupti.so*"))
        paths += sorted(glob.glob(f"{entry}/nvidia/cu*/lib/libcupti.so*"))
    return names + paths


def libcupti_loadable() -> bool:
    return any(_loadable(c) for c in _cupti_candidates())


def cuda_device_count() -> int:
    """Ask the driver API directly (no torch import): cuInit + cuDeviceGetCount."""
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        if lib.cuInit(0) != 0:
            return 0
        count = ctypes.c_int(0)
        if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
        return count.value
    return 0


def sshd_path() -> str | None:
    for cand in ("/usr/sbin/sshd", shutil.which("sshd")):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


_LAB_PROBE = """
import json
import scripts.lab as lab
check = getattr(lab, "available", None)
print(json.dumps({"ok": bool(check()) if callable(check) else True}))
"""


def lab_available(qemu: str | None) -> bool:
    """qemu-system-aarch64 plus the lab package; `scripts.lab.available()` may veto."""
    if not qemu or not (REPO_ROOT / "scripts" / "lab" / "__init__.py").is_file():
        return False
    return bool(_run_probe(_LAB_PROBE, timeout=30, env={"PYTHONPATH": str(REPO_ROOT)}).get("ok"))


def ruff_version() -> str | None:
    exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not os.access(exe, os.X_OK):
        return None
    try:
        proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = _SEMVER.search(proc.stdout)
    return match.group(1) if match else None


def torch_fl_ext_built() -> bool:
    """The extension is built: in this checkout, or (a board's lanes, run from a checkout
    without torch_fl/) in the installed package, found without importing it."""
    if (REPO_ROOT / "torch_fl").is_dir():
        return bool(glob.glob(str(REPO_ROOT / "torch_fl" / "_C*.so")))
    spec = importlib.util.find_spec("torch_fl")
    return bool(spec and spec.origin and glob.glob(str(Path(spec.origin).parent / "_C*.so")))


def detect(only: set[str] | None = None) -> dict[str, Any]:
    """Probe every capability (or those in `only`); values are plain JSON types."""
    want = (lambda name: True) if only is None else (lambda name: name in only)
    caps: dict[str, Any] = {}
    probes: dict[str, Callable[[], Any]] = {
        "arch": platform.machine,
        "page_size": lambda: os.sysconf("SC_PAGE_SIZE"),
        "libcupti": libcupti_loadable,
        "cuda_device": lambda: cuda_device_count() > 0,
        "sshd": lambda: sshd_path() is not None,
        "qemu_system_aarch64": lambda: shutil.which("qemu-system-aarch64") is not None,
        "torch_fl_ext": torch_fl_ext_built,
        "ruff": ruff_version,
        "xdist": lambda: importlib.util.find_spec("xdist") is not None,
        "box64": box64_version,
    }
    for name, probe in probes.items():
        if want(name):
            caps[name] = probe()
    if want("lab"):
        caps["lab"] = lab_available(shutil.which("qemu-system-aarch64"))
    if want("ucp") or want("bpu_cores"):
        lib = ucp_library()
        caps["ucp"] = lib is not None
        caps["bpu_cores"] = bpu_cores(lib)
    if want("hbdk4"):
        caps["hbdk4"] = hbdk4_driver()["kind"]
    return caps


def is_present(value: Any) -> bool:
    """A capability counts as present unless it is false, zero, empty or "none"."""
    return value not in (None, False, 0, "", "none")


SYSTEM_PACKAGES = REPO_ROOT / "scripts" / "system-packages.txt"
# Capabilities that come from the same packages as a group in SYSTEM_PACKAGES.
_PACKAGE_GROUP = {"sshd": "sshd", "lab": "lab", "qemu_system_aarch64": "lab"}


def system_packages(path: Path = SYSTEM_PACKAGES) -> dict[str, list[str]]:
    """`capability: pkg pkg ...` lines of scripts/system-packages.txt as a dict."""
    groups: dict[str, list[str]] = {}
    if not path.is_file():
        return groups
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if ":" in line:
            name, _, packages = line.partition(":")
            groups[name.strip()] = packages.split()
    return groups


def enable_hint(missing: list[str]) -> str:
    """The exact command that installs what the missing requirements need ("" if none helps)."""
    groups = system_packages()
    packages: list[str] = []
    for text in missing:
        name = re.split(r"[\s<>=!]", text.strip().removeprefix("not ").strip(), maxsplit=1)[0]
        for package in groups.get(_PACKAGE_GROUP.get(name, ""), []):
            if package not in packages:
                packages.append(package)
    if not packages:
        return ""
    sudo = "" if hasattr(os, "geteuid") and os.geteuid() == 0 else "sudo "
    return f"{sudo}apt-get install -y --no-install-recommends {' '.join(packages)}"

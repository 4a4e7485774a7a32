"""The compiler flags of the C++ extension, read off the torch it is built against.

A wheel from PyPI, a distribution's package (Debian's python3-torch) and a source build differ in
what their headers need: the C++ standard (torch 2.13's ATen wants C++17, newer ones C++20), and
whether pybind11 comes bundled (PyPI's wheels carry it in torch/include; Debian's torch does not,
its pybind11 is the pybind11-dev package). So the standard is read from the headers' own
`#error` guards, pybind11 is looked for where each kind of torch keeps it, and what is missing is
named with the package that provides it, before a compile that would fail ten minutes in.

Standard library only (setup.py runs it from its file, before torch_fl can be imported).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

# Headers whose guards state the C++ standard torch needs (`#if __cplusplus < 201703L / #error`).
GUARD_HEADERS = ("ATen/ATen.h", "c10/macros/Macros.h", "c10/util/C++17.h", "torch/extension.h")
_GUARD = re.compile(r"__cplusplus\s*<\s*(\d{6})L?")
STANDARDS = {201703: "c++17", 202002: "c++20", 202302: "c++23"}
MINIMUM = "c++17"


class BuildSetupError(RuntimeError):
    """A header or tool the build needs is missing, or the compiler cannot do what torch needs."""


@dataclass(frozen=True)
class BuildFlags:
    cxx_standard: str
    """`-std=` value, the newest standard any guard header of torch demands."""
    include_dirs: tuple[str, ...] = field(default=())
    """Extra include directories (pybind11's, where torch does not bundle it)."""
    compiler: str = "c++"
    notes: tuple[str, ...] = field(default=())


def required_standard(include_dirs: list[str]) -> str:
    """The C++ standard torch's headers in `include_dirs` demand (c++17 if none says)."""
    needed = 0
    for root in include_dirs:
        for rel in GUARD_HEADERS:
            path = Path(root) / rel
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            for line in text.splitlines():
                match = _GUARD.search(line)
                if match and ("#if" in line or "#elif" in line):
                    needed = max(needed, int(match.group(1)))
    if not needed:
        return MINIMUM
    known = [v for v in STANDARDS if v >= needed]
    if not known:
        raise BuildSetupError(
            f"torch's headers need C++ newer than this build knows ({needed}L). Fix: update "
            "torch_fl/build_flags.py STANDARDS"
        )
    return STANDARDS[min(known)]


def _pybind11_dirs(include_dirs: list[str]) -> tuple[tuple[str, ...], str]:
    """Where pybind11's headers are: bundled with torch, the pybind11 pip package, or the
    system's include path."""
    if any((Path(d) / "pybind11" / "pybind11.h").is_file() for d in include_dirs):
        return (), "pybind11: bundled with torch"
    try:
        import pybind11  # a pip install of pybind11 (not a dependency unless torch lacks it)

        return (pybind11.get_include(),), f"pybind11: pip package {pybind11.__version__}"
    except ImportError:
        pass
    system = [Path(sysconfig.get_config_var("INCLUDEDIR") or "/usr/include"), Path("/usr/include")]
    for root in system:
        if (root / "pybind11" / "pybind11.h").is_file():
            return (), f"pybind11: system headers in {root}"
    raise BuildSetupError(
        "pybind11's headers are missing: this torch does not bundle them (distribution builds "
        "such as Debian's python3-torch do not). Fix: `apt-get install pybind11-dev`, or "
        "`pip install pybind11`"
    )


def _compiler() -> str:
    name = os.environ.get("CXX") or "c++"
    exe = name.split()[0]
    if shutil.which(exe) is None:
        raise BuildSetupError(
            f"no C++ compiler: {exe!r} is not on PATH (from CXX or the default c++). Fix: "
            "`apt-get install g++` (on the board too: the aarch64 g++), or set CXX"
        )
    return name


def _python_headers() -> None:
    include = sysconfig.get_paths().get("include") or ""
    if not (Path(include) / "Python.h").is_file():
        raise BuildSetupError(
            f"Python's headers are missing (no Python.h in {include or '?'}). Fix: "
            "`apt-get install python3-dev` (the -dev package of this Python)"
        )


def compiler_accepts(compiler: str, standard: str) -> str | None:
    """None when `compiler` compiles C++ at `standard`; else its first error line."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.cpp"
        src.write_text("#include <vector>\nint main() { std::vector<int> v; return 0; }\n")
        try:
            run = subprocess.run(
                [*compiler.split(), f"-std={standard}", "-fsyntax-only", str(src)],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{type(exc).__name__}: {exc}"
    if run.returncode == 0:
        return None
    return (run.stderr.strip().splitlines() or [f"exit {run.returncode}"])[0]


def _system_include_dirs() -> list[str]:
    """Where the compiler finds headers without -I: a distribution's torch keeps its C++ headers
    there (Debian's libtorch-dev: /usr/include/ATen), not in torch/include."""
    found = [sysconfig.get_config_var("INCLUDEDIR") or "/usr/include", "/usr/include"]
    return list(dict.fromkeys(found))


def torch_header_dirs(include_dirs: list[str]) -> list[str]:
    """torch's include directories (cpp_extension's) and the system's, where torch's own
    ATen/ATen.h is; BuildSetupError with the fix when it is in none of them."""
    dirs = list(dict.fromkeys([*include_dirs, *_system_include_dirs()]))
    if not any((Path(d) / "ATen" / "ATen.h").is_file() for d in dirs):
        raise BuildSetupError(
            "torch's C++ headers are missing (no ATen/ATen.h in "
            f"{', '.join(dirs)}): this torch ships without them. Fix: a distribution's torch "
            "keeps them in its -dev package (Debian: `apt-get install libtorch-dev`); a pip "
            "torch has them in torch/include (reinstall it)"
        )
    return dirs


def flags_for(include_dirs: list[str], check_compiler: bool = True) -> BuildFlags:
    """The build's flags for the torch whose headers are `include_dirs`; BuildSetupError names
    what is missing and its fix."""
    standard = required_standard(torch_header_dirs(include_dirs))
    extra, pybind_note = _pybind11_dirs(include_dirs)
    compiler = _compiler()
    _python_headers()
    if check_compiler:
        failure = compiler_accepts(compiler, standard)
        if failure is not None:
            raise BuildSetupError(
                f"{compiler} cannot compile -std={standard}, which torch's headers need "
                f"({failure}). Fix: a newer g++ (g++ 10 or later for C++20), or set CXX"
            )
    notes = (f"-std={standard} (from torch's headers)", pybind_note)
    return BuildFlags(standard, extra, compiler, notes)

"""Build of the torch_fl C++ extension (csrc/) against the installed torch.

Select the accelerator with `ACCELERATOR=bpu` (what `invoke build --accelerator bpu` sets).
Build flags: -O2 without debug info; FLAGOS_BUILD_DEBUG=1 (`invoke build --debug`) opts in to -O0 -g.
Install without build isolation so pip compiles against the torch you have:
    pip install --no-build-isolation -e .
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent


def _torch_fl_file(name: str) -> dict:
    """A stdlib-only module of torch_fl, run from its file: `import torch_fl` needs torch and
    the very extension this builds."""
    return runpy.run_path(str(ROOT / "torch_fl" / f"{name}.py"))


SUPPORTED_ACCELERATORS: tuple[str, ...] = _torch_fl_file("targets")["ACCELERATORS"]


def selected_accelerator() -> str:
    accelerator = os.environ.get("ACCELERATOR", "bpu").strip().lower()
    if accelerator not in SUPPORTED_ACCELERATORS:
        sys.exit(
            f"error: unknown accelerator {accelerator!r} (from ACCELERATOR); "
            f"supported: {', '.join(SUPPORTED_ACCELERATORS)}. "
            "Example: ACCELERATOR=bpu pip install --no-build-isolation -e ."
        )
    return accelerator


def build_extension():
    # A previously installed torch_fl must not be autoloaded into the build (it may be the very
    # thing being rebuilt, or broken).
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths

    debug = os.environ.get("FLAGOS_BUILD_DEBUG", "0") == "1"
    torch_version = torch.__version__.split("+")[0]
    # the C++ standard torch's headers demand, pybind11 where this torch keeps it (or not)
    build_flags = _torch_fl_file("build_flags")
    try:
        flags = build_flags["flags_for"](include_paths())
    except build_flags["BuildSetupError"] as exc:
        sys.exit(f"error: cannot build torch_fl against torch {torch.__version__}: {exc}")
    for note in flags.notes:
        print(f"torch_fl build: {note}", file=sys.stderr)
    cflags = [f"-std={flags.cxx_standard}", "-fvisibility=hidden",
              f'-DTORCH_FL_TORCH_VERSION="{torch_version}"']  # fmt: skip
    # Python's own CFLAGS carry -g (13.5 MB .so instead of ~0.5 MB); -g0 last wins.
    cflags += ["-O0", "-g"] if debug else ["-O2", "-g0"]
    sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*.cpp"))
    # Fewer compiler jobs than files: each job compiles a share of csrc/ as one unit, parsing
    # torch's headers once (torch_fl/unity_build.py: `invoke build` 37.5-44.0 -> 20.5 s on 2 cores).
    unity = _torch_fl_file("unity_build")
    try:
        jobs = unity["compile_jobs"]()
    except ValueError as exc:
        sys.exit(f"error: {exc}")
    sources = unity["units"](ROOT, sources, jobs)
    ext = CppExtension(
        name="torch_fl._C",
        sources=sources,
        include_dirs=[str(ROOT / "csrc"), *flags.include_dirs],
        extra_compile_args=cflags,
        extra_link_args=[] if debug else ["-Wl,--strip-debug"],
        libraries=["dl"],
    )
    build = BuildExtension.with_options(no_python_abi_suffix=False)
    return ext, build, torch_version, debug, flags.cxx_standard


def write_build_config(accelerator: str, torch_version: str, debug: bool, standard: str) -> None:
    """Record what was built in the package itself (read by torch_fl.build_info())."""
    import sysconfig

    config = {
        "accelerator": accelerator,
        "torch_built_against": torch_version,
        "debug": debug,
        "compiler": sysconfig.get_config_var("CC") or "c++",
        "cxx_standard": standard,
    }
    _torch_fl_file("atomic")["write_text"](
        ROOT / "torch_fl" / "_build_config.json", json.dumps(config, indent=2) + "\n"
    )


accelerator = selected_accelerator()
ext, build_ext, torch_version, debug, standard = build_extension()
write_build_config(accelerator, torch_version, debug, standard)
setup(ext_modules=[ext], cmdclass={"build_ext": build_ext})

"""Benchmarks on another x86 CPU kind than this host's: an AVX2-only CPU, emulated on an AVX-512
host by masking what CPUID reports (`bench_sim.py --cpu-kind avx2`).

Issue 20's targets hold per CPU kind, and the kernels each library runs are picked from CPUID at
run time: ONNX Runtime's MLAS (AVX2 u8s8 GEMMs add products in saturating int16 where there is no
VNNI, so the sim's probe moves it to its `mixed` path), PyTorch's ATen and oneDNN, and this
project's extension (its lookups, depthwise and narrow convs take their AVX2 forms, and the sim
moves 1x1 convs and GEMMs to its pair GEMM op, which it leaves to ORT on AVX-512; its grouped and
one-row GEMM ops their portable loops). The stand-in
`cpu_kinds/avx2_only.c`, preloaded into a fresh process, clears the AVX-512, VNNI and AMX bits
from CPUID before any of them looks, so each picks the code it picks on an AVX2-only host. The
instructions then run on this host's cores, which is not the same as a Haswell's or a Zen 3's;
the ratios between variants of one run are what such a run measures (docs/compile-models.md).

Needs Linux's CPUID faulting (the `cpuid_fault` CPU flag; a VM's hypervisor must pass it on) and
a C compiler; `unsupported()` says what is missing.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from torch_fl.bpu.runtime.sim_kernels import cpu_flags

__all__ = ["KINDS", "MARK", "check", "enter", "environment", "library", "rerun_as", "unsupported"]

HERE = Path(__file__).resolve().parent
KINDS = {"avx2": HERE / "cpu_kinds" / "avx2_only.c"}
"""The emulated kinds and their stand-in's source; "native" (this host as it is) needs none."""
MARK = "TORCH_FL_BENCH_CPU_KIND"
"""Set in the emulated process: which kind it runs as (so a benchmark re-executes itself once)."""
# glibc picked its string functions before the stand-in loaded: its own tunable drops AVX-512
GLIBC_MASK = "glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD,-AVX_VNNI"


def unsupported(kind: str) -> str | None:
    """Why `kind` cannot be emulated on this host (None: it can)."""
    if kind not in KINDS:
        return f"unknown CPU kind {kind!r}: one of native, {', '.join(KINDS)}"
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"emulating {kind} needs an x86_64 Linux host, not {platform.machine()}"
    if "cpuid_fault" not in cpu_flags():
        return (
            "this CPU (or its hypervisor) has no CPUID faulting (no cpuid_fault in "
            f"/proc/cpuinfo): {kind} cannot be emulated here; run on such a host instead"
        )
    if _compiler() is None:
        return "no C compiler (cc or gcc) to build the CPUID stand-in; install gcc"
    return None


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def library(kind: str, cache: Path | None = None) -> Path:
    """The stand-in for `kind`, built once per source (atomically: a half-written library is
    never loaded) into `cache` (default: ~/.cache/torch_fl/cpu_kind)."""
    reason = unsupported(kind)
    if reason is not None:
        raise RuntimeError(reason)
    source = KINDS[kind]
    text = source.read_bytes()
    cache = cache or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "torch_fl"
    out = cache / "cpu_kind" / f"{source.stem}-{hashlib.sha256(text).hexdigest()[:16]}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        built = Path(tmp) / out.name
        cc = _compiler()
        assert cc is not None  # unsupported() checked
        result = subprocess.run(
            [cc, "-O2", "-shared", "-fPIC", "-Wall", "-o", str(built), str(source)],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise RuntimeError(f"building the {kind} stand-in failed:\n{result.stderr}")
        os.replace(built, out)
    return out


def environment(kind: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) for a process that runs as `kind`."""
    env = dict(os.environ if base is None else base)
    preload = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{library(kind)}{' ' + preload if preload else ''}"
    env["GLIBC_TUNABLES"] = ":".join(t for t in (env.get("GLIBC_TUNABLES"), GLIBC_MASK) if t)
    env.pop("PYTHONFAULTHANDLER", None)  # its SIGSEGV handler would take the CPUID faults
    env[MARK] = kind
    return env


def rerun_as(kind: str, script: str, argv: list[str], name: str) -> int | None:
    """A benchmark's step into `kind`: where this process does not run as it yet, run `script`
    with `argv` again in a fresh process that does (the libraries read CPUID once, when they
    load) and return its exit code (130, after one line naming `name`, on Ctrl-C: the child got
    it too); None where this process already runs as `kind`. ValueError where this host cannot
    emulate it, or the stand-in will not build (the message says why)."""
    if os.environ.get(MARK) == kind:
        return None
    reason = unsupported(kind)
    if reason is not None:
        raise ValueError(reason)
    try:
        env = environment(kind)
    except RuntimeError as exc:
        raise ValueError(str(exc)) from None
    sys.stdout.flush()
    try:
        return subprocess.call([sys.executable, script, *argv], env=env)
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130


def enter(
    kind: str, script: str, argv: list[str], parser: argparse.ArgumentParser, name: str
) -> tuple[int | None, str]:
    """A benchmark's `--cpu-kind`: (None, what runs here) where this process runs as `kind`
    ("native": this host as it is), after printing it; else (the exit code of `script` run again
    as `kind`: rerun_as, ""). A host that cannot emulate `kind` is the parser's error (exit 2),
    a process the emulation missed a SystemExit naming `name`."""
    if kind == "native":
        return None, "native"
    try:
        code = rerun_as(kind, script, argv, name)
    except ValueError as exc:
        parser.error(f"--cpu-kind {kind}: {exc}")
    if code is not None:
        return code, ""
    try:
        report = check(kind)
    except RuntimeError as exc:
        raise SystemExit(f"{name}: --cpu-kind {kind}: {exc}") from None
    print(f"CPU kind: {report}")
    return None, report


def check(kind: str) -> str:
    """In the emulated process: that the libraries saw `kind` (else RuntimeError), and what they
    picked, for the benchmark's report."""
    import torch

    from torch_fl import _C

    torch_isa = torch.backends.cpu.get_cpu_capability()
    ours, lookups, narrow = _C._depthwise_kernel(), _C._lookup_kernel(), _C._narrow_kernel()
    pairs = _C._pair_gemm_kernel()
    if os.environ.get(MARK) != kind or torch_isa != "AVX2" or ours != "avx2":
        raise RuntimeError(
            f"the {kind} emulation did not take: PyTorch runs {torch_isa}, the extension's "
            f"depthwise op {ours} (want AVX2 for both); was the stand-in preloaded?"
        )
    return (
        f"{kind}, emulated (CPUID masked): PyTorch {torch_isa}, the extension's lookups "
        f"{lookups}, its depthwise op {ours}, its narrow conv op {narrow}, its pair GEMM op "
        f"{pairs}, its grouped and one-row GEMM ops off (no AVX-512)"
    )

"""The lookup ops' AVX2 forms (csrc/runtime/ort_lookup.cpp: byte and float lookups, clamps,
means and product pairs), which an AVX-512 host's own runs never take: the lookup tests again,
in a process whose CPUID shows an AVX2-only CPU (scripts/cpu_kind.py's stand-in)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from scripts import cpu_kind

ROOT = cpu_kind.HERE.parent
FILES = [
    "tests/unit/test_lookups.py",
    "tests/compile/test_lookup_mean.py",
    "tests/compile/test_concat_lookup.py",
    "tests/compile/test_sim_lookups.py",
]

pytestmark = pytest.mark.skipif(
    cpu_kind.unsupported("avx2") is not None, reason=str(cpu_kind.unsupported("avx2"))
)


def test_lookup_tests_pass_on_the_avx2_forms():
    env = cpu_kind.environment("avx2")
    form = subprocess.run(
        [sys.executable, "-c", "from torch_fl import _C; print(_C._lookup_kernel())"],
        env=env, cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert form.returncode == 0, form.stderr[-2000:]
    assert form.stdout.strip() == "avx2"  # the form under test, not the portable loop
    # pytest's faulthandler would take the SIGSEGVs that CPUID raises in the emulated process
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:faulthandler", "-p", "no:cacheprovider",
         *FILES],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and " failed" not in run.stdout

"""The extension ops' AVX2 forms, which an AVX-512 host's own runs never take: the lookups'
(csrc/runtime/ort_lookup.cpp: byte and float lookups, clamps, means and product pairs) and the
depthwise and grouped convs' (csrc/runtime/ort_depthwise_rows.inc in 8 lanes) and the narrow
conv's (csrc/runtime/ort_narrow.cpp, 16-bit products) and the exact 16-bit GEMM's
(csrc/runtime/ort_pair_gemm.cpp). Their tests run
again in a process whose CPUID shows an AVX2-only CPU (scripts/cpu_kind.py's stand-in), after a
check that the form under test is the AVX2 one, not the portable loop."""

from __future__ import annotations

import subprocess
import sys

import pytest

from scripts import cpu_kind

ROOT = cpu_kind.HERE.parent
SUITES = {
    # the ops: (what reports their form, the test files)
    "lookups": (
        "_lookup_kernel",
        [
            "tests/unit/test_lookups.py",
            "tests/unit/test_pair_product.py",
            "tests/compile/test_lookup_mean.py",
            "tests/compile/test_concat_lookup.py",
            "tests/compile/test_sim_lookups.py",
        ],
    ),
    "convs": (
        "_depthwise_kernel",
        ["tests/compile/test_depthwise.py", "tests/compile/test_grouped_conv.py"],
    ),
    "narrow": ("_narrow_kernel", ["tests/compile/test_narrow_op.py"]),
    # the op the sim takes only where its kernels are ORT's u8u8 ones (no VNNI): its compiled
    # model's convs move only here
    "pairs": (
        "_pair_gemm_kernel",
        ["tests/compile/test_pair_gemm.py", "tests/compile/test_clamp_fold.py"],
    ),
}

pytestmark = pytest.mark.skipif(
    cpu_kind.unsupported("avx2") is not None, reason=str(cpu_kind.unsupported("avx2"))
)


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_the_ops_tests_pass_on_their_avx2_forms(suite):
    reporter, files = SUITES[suite]
    env = cpu_kind.environment("avx2")
    form = subprocess.run(
        [sys.executable, "-c", f"from torch_fl import _C; print(_C.{reporter}())"],
        env=env, cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert form.returncode == 0, form.stderr[-2000:]
    assert form.stdout.strip() == "avx2"  # the form under test, not the portable loop
    # pytest's faulthandler would take the SIGSEGVs that CPUID raises in the emulated process
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:faulthandler", "-p", "no:cacheprovider",
         *files],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and " failed" not in run.stdout

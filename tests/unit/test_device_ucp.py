"""Loading the UCP runtime at run time: the stand-in library, bad paths, the env file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.process import ROOT, run_python

PROBE = (
    "import warnings; warnings.simplefilter('always');"
    "import torch, torch_fl;"
    "a = torch.arange(1000.0, device='flagos'); b = (a * 2 + 1).sum();"
    "assert b.item() == 1000.0 * 999 + 1000, b;"
    "print('backend=' + torch.flagos.memory_backend());"
    "print('lib=' + str(torch_fl.build_info()['ucp_library']))"
)


@pytest.mark.board
def test_standin_ucp_library_is_used(standin_ucp_lib: Path, tmp_path: Path):
    stats = tmp_path / "stats.txt"
    done = run_python(
        PROBE + ";del a, b; torch.flagos.empty_cache()",
        env={"FLAGOS_BPU_UCP_LIB": str(standin_ucp_lib), "STANDIN_UCP_STATS": str(stats)},
    )
    assert done.returncode == 0, done.stderr
    assert "backend=ucp" in done.stdout
    assert f"lib={standin_ucp_lib}" in done.stdout
    counters = dict(kv.split("=") for kv in stats.read_text().split())
    assert int(counters["allocs"]) >= 1, counters
    assert int(counters["flushes"]) >= 1, "CPU access to UCP memory must maintain the caches"
    assert int(counters["frees"]) == int(counters["allocs"]), "empty_cache returns every block"


def test_missing_ucp_library_warns_and_uses_host_memory(tmp_path: Path):
    missing = tmp_path / "nope" / "libhbucp.so"
    done = run_python(PROBE, env={"FLAGOS_BPU_UCP_LIB": str(missing)})
    assert done.returncode == 0, done.stderr
    assert "backend=host" in done.stdout
    assert "FLAGOS_BPU_UCP_LIB" in done.stderr and str(missing) in done.stderr
    assert "unset FLAGOS_BPU_UCP_LIB" in done.stderr  # the message names the fix


def test_library_without_ucp_symbols_is_rejected():
    libm = "libm.so.6"
    done = run_python(PROBE, env={"FLAGOS_BPU_UCP_LIB": libm})
    assert done.returncode == 0, done.stderr
    assert "backend=host" in done.stdout
    assert "is not a UCP runtime: missing hbUCPMallocCached" in done.stderr


def test_no_configuration_means_host_memory_without_warning(tmp_path: Path):
    # A path that surely does not exist (a fixed one like /nonexistent may, on a shared host).
    no_env_file = tmp_path / "no-env-file"
    done = run_python(
        PROBE, env={"FLAGOS_BPU_UCP_LIB": "", "FLAGOS_BPU_ENV_FILE": str(no_env_file)}
    )
    assert done.returncode == 0, done.stderr
    assert "backend=host" in done.stdout
    assert "Warning" not in done.stderr


def test_env_file_from_provisioning_is_read(standin_ucp_lib: Path, tmp_path: Path):
    env_file = tmp_path / "env"
    env_file.write_text(f"# written by invoke provision\nFLAGOS_BPU_UCP_LIB={standin_ucp_lib}\n")
    done = run_python(PROBE, env={"FLAGOS_BPU_ENV_FILE": str(env_file)})
    assert done.returncode == 0, done.stderr
    assert "backend=ucp" in done.stdout


def test_unknown_accelerator_fails_at_once_listing_supported():
    proc = subprocess.run(
        [sys.executable, "setup.py", "--name"],
        cwd=ROOT,
        env={"ACCELERATOR": "npu", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "unknown accelerator 'npu'" in proc.stderr
    assert "supported: bpu" in proc.stderr


def test_invoke_build_rejects_unknown_accelerator():
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "build", "--accelerator", "cuda"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "unknown accelerator 'cuda'" in proc.stderr + proc.stdout

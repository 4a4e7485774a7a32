"""Capability detection probes the machine; platform profiles force values for dry runs."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from scripts.testmatrix import capabilities as caps
from scripts.testmatrix.platforms import PROFILES, profile
from scripts.testmatrix.schema import load

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_basic_facts_match_the_machine() -> None:
    found = caps.detect({"arch", "page_size", "sshd", "xdist", "qemu_system_aarch64"})
    assert found["arch"] == platform.machine()
    assert found["page_size"] == os.sysconf("SC_PAGE_SIZE")
    assert found["sshd"] == (caps.sshd_path() is not None)
    assert found["qemu_system_aarch64"] == (shutil.which("qemu-system-aarch64") is not None)
    assert found["xdist"] is True
    assert set(caps.detect()) == set(caps.CAPABILITIES)  # every declared capability is probed


def _standin_ucp(tmp_path: Path, cores: int) -> Path:
    """A stand-in libhbucp exporting hb_bpu_core_num (test-only, built in tmp)."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler to build the stand-in library")
    src = tmp_path / "ucp_standin.c"
    src.write_text(f"int hb_bpu_core_num(void) {{ return {cores}; }}\n")
    lib = tmp_path / "libhbucp_standin.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


def test_ucp_found_through_env_and_cores_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = _standin_ucp(tmp_path, 4)
    monkeypatch.setenv("FLAGOS_BPU_UCP_LIB", str(lib))
    found = caps.detect({"ucp"})
    assert found == {"ucp": True, "bpu_cores": 4}
    monkeypatch.setenv("FLAGOS_BPU_UCP_LIB", str(tmp_path / "missing.so"))
    if not Path("/usr/hobot/lib/libhbucp.so").exists():
        assert caps.detect({"ucp"}) == {"ucp": False, "bpu_cores": 0}


def test_ucp_from_env_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = _standin_ucp(tmp_path, 2)
    env_file = tmp_path / "env"
    env_file.write_text(f"# written by provisioning\nFLAGOS_BPU_UCP_LIB={lib}\n")
    monkeypatch.delenv("FLAGOS_BPU_UCP_LIB", raising=False)
    monkeypatch.setenv("FLAGOS_BPU_ENV_FILE", str(env_file))
    assert caps.detect({"ucp"}) == {"ucp": True, "bpu_cores": 2}


@pytest.mark.parametrize(
    ("script", "version"),
    [
        ('echo "Box64 arm64 v0.4.5 1a2b3c with Dynarec built on Jan 1 2025" >&2', "0.4.5"),
        ('echo "[BOX64] Box64 with Dynarec v0.2.6 abc built on ..."', "0.2.6"),
        ('echo "something else"', None),
    ],
)
def test_box64_version_read_from_either_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str, version: str | None
) -> None:
    fake = tmp_path / "box64_standin"
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("FLAGOS_BPU_EMULATOR", str(fake))
    assert caps.box64_version() == version


@pytest.mark.parametrize(
    ("drivers_py", "kind"),
    [
        (None, "none"),
        (
            "class _D:\n    kind = 'emulated'\n    version = '4.1'\n\n"
            "def discover(refresh=False):\n    return _D()\n",
            "emulated",
        ),
        ("raise ImportError('hbdk4 wheels are x86_64 only')\n", "none"),
        ("def discover(refresh=False):\n    return type('D', (), {'kind': 'weird'})()\n", "none"),
    ],
)
def test_hbdk4_via_discover_tolerates_absence(
    tmp_path: Path, drivers_py: str | None, kind: str
) -> None:
    pkg = tmp_path / "torch_fl" / "bpu"
    pkg.mkdir(parents=True)
    (tmp_path / "torch_fl" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    if drivers_py is not None:
        (pkg / "drivers.py").write_text(drivers_py)
    result = caps.hbdk4_driver(tmp_path)
    assert result["kind"] == kind
    if kind == "none":
        assert result["note"]  # says why


def test_presence_rules() -> None:
    assert not any(caps.is_present(v) for v in (None, False, 0, "", "none"))
    assert all(caps.is_present(v) for v in (True, 4, "0.4.5", "native"))


def test_profiles_cover_every_capability_and_platform() -> None:
    assert set(PROFILES) == {"x86-ci", "x86-dev", "rdk-s100", "rdk-s600", "gpu-host"}
    for name, values in PROFILES.items():
        assert set(values) == set(caps.CAPABILITIES), name
    assert profile("rdk-s600")["page_size"] == 65536 and profile("rdk-s600")["bpu_cores"] == 4
    with pytest.raises(KeyError, match="use one of"):
        profile("nope")


@pytest.mark.parametrize(
    ("name", "cupti_expected", "board_emu_runs"),
    [
        ("x86-ci", True, False),
        ("x86-dev", True, True),
        ("rdk-s100", True, False),
        ("rdk-s600", True, False),
        ("gpu-host", False, False),
    ],
)
def test_repo_matrix_under_each_profile(
    name: str, cupti_expected: bool, board_emu_runs: bool
) -> None:
    matrix = load(REPO / "matrix.yaml")
    values = profile(name)
    cupti = [e for e in matrix.expectations if "test_cupti" in e.test]
    assert any(e.active("profiler", values) for e in cupti) is cupti_expected
    assert (not matrix.lanes["board-emu"].missing(values)) is board_emu_runs

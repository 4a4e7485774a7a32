"""box64 decisions from recorded output and facts."""

from __future__ import annotations

import pytest

from provision import box64 as b
from provision import probe


@pytest.mark.parametrize(
    ("stdout", "stderr", "expected"),
    [
        ("", "Box64 arm64 v0.4.5 3b1c0e2 with Dynarec built on Nov 29 2025 12:00:00\n", (0, 4, 5)),
        ("Box64 with Dynarec v0.2.6 5c6fc1c8 built on Jan  2 2024\n", "", (0, 2, 6)),
        ("[BOX64] Box64 with Dynarec v0.2.6 5c6fc1c8 built on Jan  2 2024\n", "", (0, 2, 6)),
        ("", "[BOX64] Box64 arm64 v0.3.4 with Dynarec built on Mar  1 2025\n", (0, 3, 4)),
        ("noise v9.9.9 from a wrapper\n", "Box64 arm64 v0.4.3 with Dynarec\n", (0, 4, 3)),
        ("", "box64: command not found\n", None),
        ("", "", None),
    ],
)
def test_version_formats(stdout, stderr, expected):
    assert b.parse_version(stdout, stderr) == expected


def test_policy():
    assert b.parse_policy("0.4.0") == (0, 4, 0) == b.parse_policy("v0.4.0")
    assert b.meets_policy((0, 4, 0), (0, 4, 0))
    assert b.meets_policy((0, 10, 0), (0, 4, 0))  # numeric, not string comparison
    assert not b.meets_policy((0, 3, 4), (0, 4, 0))
    assert not b.meets_policy(None, (0, 4, 0))
    with pytest.raises(ValueError, match="MAJOR.MINOR.PATCH"):
        b.parse_policy("0.4")


APT_POLICY_TRIXIE = """box64:
  Installed: 0.3.4+dfsg-1
  Candidate: 0.4.3+dfsg-1
  Version table:
     0.4.3+dfsg-1 500
        500 http://deb.debian.org/debian sid/main arm64 Packages
 *** 0.3.4+dfsg-1 990
"""
APT_SHOW = "Package: box64\nVersion: 0.4.3+dfsg-1\nDepends: libc6 (>= 2.39), libgcc-s1 (>= 3.0)\n"


def test_apt_parsing():
    assert b.parse_apt_policy(APT_POLICY_TRIXIE) == ("0.3.4+dfsg-1", "0.4.3+dfsg-1")
    assert b.parse_apt_policy("box64:\n  Installed: (none)\n  Candidate: (none)\n") == (None, None)
    assert b.parse_deb_version("1:0.4.3+dfsg-1") == (0, 4, 3)
    assert b.parse_libc_requirement(APT_SHOW) == (2, 39, 0)
    assert b.parse_glibc("glibc 2.35") == (2, 35, 0)


def test_install_decisions():
    minimum = (0, 4, 0)
    keep = b.decide_install((0, 4, 5), minimum, candidate=None, libc_needed=None, glibc=None)
    assert keep.kind == "none"
    # Debian trixie VM: 0.3.4 installed, 0.4.3 candidate, glibc 2.41 -> distro package
    d = b.decide_install(
        (0, 3, 4), minimum, candidate="0.4.3+dfsg-1", libc_needed=(2, 39, 0), glibc=(2, 41, 0)
    )
    assert d.kind == "distro"
    # Ubuntu 22.04 (S100 image) with a Debian .deb candidate: glibc 2.35 < 2.39 -> source
    d = b.decide_install(
        None, minimum, candidate="0.4.3+dfsg-1", libc_needed=(2, 39, 0), glibc=(2, 35, 0)
    )
    assert d.kind == "source" and "glibc" in d.reason
    # Ubuntu 24.04 candidate 0.2.6 is too old -> source
    d = b.decide_install(None, minimum, candidate="0.2.6+ds-1", libc_needed=None, glibc=(2, 39, 0))
    assert d.kind == "source" and "older" in d.reason
    d = b.decide_install(None, minimum, candidate=None, libc_needed=None, glibc=(2, 39, 0))
    assert d.kind == "source"
    d = b.decide_install(
        None, minimum, candidate="0.4.3", libc_needed=None, glibc=None, allow_distro=False
    )
    assert d.kind == "source"


def test_build_jobs_bounded_by_memory():
    assert b.build_jobs(8, 16000) == 8
    assert b.build_jobs(8, 3000) == 2  # low-memory board: make -j2
    assert b.build_jobs(4, 800) == 1
    assert b.build_jobs(0, 0) == 1
    assert b.cmake_args(["-DFOO=1"])[:2] == [
        "-DARM_DYNAREC=ON",
        "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
    ]


def test_never_on_x86_64():
    assert not b.may_install_on("x86_64")
    assert b.may_install_on("aarch64")


def test_probe_verdicts():
    ok = probe.interpret(0, f"{probe.MARKER} pagesize=65536\n", "", 65536, "box64")
    assert ok.ok and ok.guest_pagesize == 65536
    abort = probe.interpret(
        255,
        "",
        "Error: PageSize configuration is wrong: configured with 4096, but got 65536",
        65536,
        "box64",
    )
    assert not abort.ok and "0.4.0" in abort.detail
    silent = probe.interpret(0, "", "[BOX64] Box64 v0.4.3", 4096, "box64")
    assert not silent.ok and "never ran" in silent.detail
    wrong = probe.interpret(0, f"{probe.MARKER} pagesize=4096\n", "", 16384, "box64")
    assert not wrong.ok and "16384" in wrong.detail
    crash = probe.interpret(139, "", "Segmentation fault", 4096, "box64")
    assert not crash.ok and "rc 139" in crash.detail

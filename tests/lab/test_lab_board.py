"""The emulated board is what provisioning will meet on an RDK S600: aarch64, large pages."""

from __future__ import annotations

from lab_helpers import EXPECTED_PAGE, guest


def test_guest_is_aarch64_with_large_pages(board):
    res = guest(board, "uname -m; getconf PAGESIZE; uname -r")
    assert res.returncode == 0, res.stderr
    arch, page, release = res.stdout.split()
    assert arch == "aarch64"
    assert int(page) == EXPECTED_PAGE, f"kernel {release} reports page size {page}"


def test_guest_has_offline_apt_with_newer_box64(board):
    # The guest has no internet: the image's own repository must offer the upgrade.
    res = guest(board, "apt-get update -qq >/dev/null 2>&1; apt-cache policy box64")
    assert res.returncode == 0, res.stderr
    assert "0.4." in res.stdout.split("Candidate:")[1].split()[0], res.stdout

"""Fixtures shared by every lane."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.process import STANDINS, build_shared_library


@pytest.fixture(scope="session")
def standin_ucp_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in libhbucp.so (tests/standins/ucp), built once per test session."""
    out = tmp_path_factory.mktemp("standin-ucp")
    return build_shared_library(STANDINS / "ucp" / "libhbucp_standin.c", out, "libhbucp_standin.so")

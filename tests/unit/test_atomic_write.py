"""torch_fl/atomic.py: a destination is replaced whole or not at all."""

from __future__ import annotations

import os

import pytest

from provision.floor import light

atomic = light.load("atomic")


def test_write_replaces_whole_and_leaves_no_temp(tmp_path):
    dest = tmp_path / "sub" / "f.json"
    atomic.write_text(dest, "old")
    atomic.write_text(dest, "new")
    assert dest.read_text() == "new"
    assert [p.name for p in dest.parent.iterdir()] == ["f.json"]
    mask = os.umask(0)
    os.umask(mask)
    assert dest.stat().st_mode & 0o777 == 0o666 & ~mask  # like open(), not mkstemp's 0o600
    atomic.write_bytes(dest, b"\x00x", mode=0o600)
    assert dest.read_bytes() == b"\x00x" and dest.stat().st_mode & 0o777 == 0o600


def test_failure_half_way_keeps_the_old_file(tmp_path):
    dest = tmp_path / "f"
    dest.write_text("intact")
    with pytest.raises(KeyboardInterrupt), atomic.replacing(dest) as tmp:
        tmp.write_text("half")
        raise KeyboardInterrupt  # Ctrl-C while writing
    assert dest.read_text() == "intact" and [p.name for p in tmp_path.iterdir()] == ["f"]
    with pytest.raises(AttributeError):  # bytes for text: refused before the file is touched
        atomic.write_text(dest, b"not text")
    assert dest.read_text() == "intact"


def test_light_loader_refuses_modules_that_import_torch():
    with pytest.raises(ValueError, match="standard-library-only"):
        light.load("device")
    assert light.load("targets").MARCHES == ("nash-e", "nash-m", "nash-p")


@pytest.mark.parametrize("name", light.LIGHT)
def test_light_modules_import_only_the_standard_library(name):
    """Provisioning and setup.py load these where torch and torch_fl cannot be imported."""
    import ast
    import sys

    tree = ast.parse(light.path_of(name).read_text())
    imported = set()
    for node in tree.body:  # what loading runs (hbdk4_guest imports hbdk4 only when it checks)
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.add(node.module.split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported

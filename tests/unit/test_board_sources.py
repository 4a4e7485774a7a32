"""The pieces of torch-fl's board install that need no board: its source tarball and ranges."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from provision import sources
from provision.steps.torch_env import has_torch_wheel, in_range


def _tree(root: Path) -> Path:
    for rel, text in {
        "pyproject.toml": "[project]\n",
        "setup.py": "",
        "README.md": "# r\n",
        "csrc/a.cpp": "int a;\n",
        "torch_fl/__init__.py": "",
        "torch_fl/_C.cpython-311-x86_64-linux-gnu.so": "ELF",
        "torch_fl/_build_config.json": "{}",
        "torch_fl/__pycache__/x.cpython-311.pyc": "",
        "tests/not_shipped.py": "",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_tarball_holds_the_sources_and_nothing_built(tmp_path: Path) -> None:
    root = _tree(tmp_path / "src")
    with tarfile.open(fileobj=io.BytesIO(sources.tarball_bytes(root))) as tar:
        names = sorted(tar.getnames())
        assert all(m.mtime == 0 and m.uid == 0 for m in tar.getmembers())
    assert names == [
        "torch-fl/README.md", "torch-fl/csrc/a.cpp", "torch-fl/pyproject.toml",
        "torch-fl/setup.py", "torch-fl/torch_fl/__init__.py",
    ]  # fmt: skip


def test_same_tree_same_bytes_and_a_changed_file_changes_the_digest(tmp_path: Path) -> None:
    root = _tree(tmp_path / "src")
    first = sources.sha256(root)
    (root / "csrc" / "a.cpp").touch()  # a new mtime alone changes nothing
    assert sources.sha256(root) == first
    (root / "csrc" / "a.cpp").write_text("int b;\n")
    assert sources.sha256(root) != first
    dest = sources.write_tarball(tmp_path / "out" / "t.tar.gz", root)
    assert dest.read_bytes() == sources.tarball_bytes(root)
    assert not list(dest.parent.glob("*.tmp*"))


@pytest.mark.parametrize(
    ("version", "spec", "ok"),
    [
        ("2.13.0+cpu", ">=2.10,<2.15", True),
        ("2.14.1", ">=2.10,<2.15", True),
        ("2.15.0", ">=2.10,<2.15", False),
        ("2.9.1", ">=2.10,<2.15", False),
        ("2.10", ">=2.10.0", True),
        ("2.13.0a0+git123", "==2.13", True),
    ],
)
def test_version_ranges(version: str, spec: str, ok: bool) -> None:
    assert in_range(version, spec) is ok


def test_the_wheelhouse_must_hold_the_pinned_torch() -> None:
    house = {"torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_aarch64.whl": "x", "numpy-2.4.6.whl": ""}
    assert has_torch_wheel(house, "2.13.0")
    assert not has_torch_wheel(house, "2.14.1")
    assert not has_torch_wheel({"torchvision-2.13.0-py3-none-any.whl": ""}, "2.13.0")

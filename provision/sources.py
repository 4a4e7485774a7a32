"""torch-fl's own sources as one reproducible tarball, for building on a board.

The tarball holds what `pip install .` needs (pyproject.toml, setup.py, README.md, csrc/,
torch_fl/) and nothing built (no .so, no _build_config.json, no caches). Entries are sorted and
stamped with fixed times and owners, so the same tree always gives the same bytes: its sha256
names the source a board was built from, and an unchanged tree means an unchanged board.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
TOP_FILES = ("pyproject.toml", "setup.py", "README.md")
TREES = ("csrc", "torch_fl")
# Build outputs and caches that may sit in a developer's tree: never part of the source.
_EXCLUDED_SUFFIXES = (".so", ".o", ".pyc")
_EXCLUDED_NAMES = {"__pycache__", "_build_config.json", ".mypy_cache", ".ruff_cache"}


def source_files(root: Path = PROJECT_ROOT) -> Iterator[Path]:
    """The files of the source tarball, sorted, relative to `root`."""
    found = [Path(name) for name in TOP_FILES if (root / name).is_file()]
    for tree in TREES:
        for path in (root / tree).rglob("*"):
            rel = path.relative_to(root)
            if any(part in _EXCLUDED_NAMES for part in rel.parts):
                continue
            if path.is_file() and not path.is_symlink() and path.suffix not in _EXCLUDED_SUFFIXES:
                found.append(rel)
    yield from sorted(found)


def tarball_bytes(root: Path = PROJECT_ROOT) -> bytes:
    """The gzip'd source tarball, the same bytes for the same tree."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in source_files(root):
            info = tarfile.TarInfo(f"torch-fl/{rel.as_posix()}")
            data = (root / rel).read_bytes()
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    # No file name and time 0 in the gzip header: they would change the bytes run to run.
    return gzip.compress(buffer.getvalue(), mtime=0)


def sha256(root: Path = PROJECT_ROOT) -> str:
    return hashlib.sha256(tarball_bytes(root)).hexdigest()


def write_tarball(dest: Path, root: Path = PROJECT_ROOT) -> Path:
    """Write the source tarball to `dest` (atomically: a temp name, then a rename)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    tmp.write_bytes(tarball_bytes(root))
    tmp.replace(dest)
    return dest

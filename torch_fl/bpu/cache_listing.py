"""The artifact cache's layout facts and its listing, in the standard library alone.

`invoke cache.list` reads the cache without importing torch (seconds saved on every call):
provision/floor/light.py loads this file by path. cache.py builds on the same facts.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

MANIFEST = "manifest.json"
HEX_KEY = re.compile(r"[0-9a-f]{64}")
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def is_key(key: object) -> bool:
    """A sha256 hex digest: the only form of key (and file stem) this cache uses."""
    return isinstance(key, str) and HEX_KEY.fullmatch(key) is not None


def default_cache_dir() -> str:
    """Where the cache lives when neither an option nor $FLAGOS_BPU_CACHE says."""
    return os.path.join(os.path.expanduser("~"), ".cache", "torch-fl", "bpu")


def valid_manifest(meta: object, key: str) -> str:
    """'' if `meta` has the shape `put` writes, else what is wrong with it."""
    if not isinstance(meta, dict):
        return f"manifest is a {type(meta).__name__}, not an object"
    files = meta.get("files")
    if not isinstance(files, dict) or not files:
        return "manifest lists no files"
    for name, info in files.items():
        if not isinstance(name, str) or not FILE_NAME.fullmatch(name) or name == MANIFEST:
            return f"manifest names a file {name!r} that is not a plain file name"
        if not isinstance(info, dict):
            return f"manifest entry for {name} is not an object"
        if not (isinstance(info.get("sha256"), str) and isinstance(info.get("size"), int)):
            return f"manifest entry for {name} has no sha256/size"
    if meta.get("key") != key:
        return f"manifest belongs to key {str(meta.get('key'))[:16]}..., not {key[:16]}..."
    return ""


def list_entries(root: Path) -> list[dict]:
    """One record per entry under `root`/artifacts (corrupt ones flagged, nothing changed)."""
    out: list[dict] = []
    base = Path(root) / "artifacts"
    if not base.is_dir():
        return out
    for directory in sorted(base.iterdir()):
        if directory.name.startswith("."):
            continue
        try:
            meta = json.loads((directory / MANIFEST).read_text())
        except (OSError, ValueError):
            meta = {"corrupt": True}
        if not is_key(directory.name) or valid_manifest(meta, directory.name):
            meta = {"corrupt": True}
        try:
            size = sum(f.stat().st_size for f in directory.iterdir() if f.is_file())
        except OSError:
            size = 0
        out.append(
            {
                "key": directory.name,
                "size": size,
                "march": meta.get("march"),
                "compiler": meta.get("compiler_id"),
                "files": sorted(meta.get("files", {})),
                "created": meta.get("created"),
                "corrupt": bool(meta.get("corrupt")),
            }
        )
    return out

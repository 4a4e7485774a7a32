"""Content-keyed cache for lab build products (kernel images, root file systems).

Products live outside the repository, under $TORCH_FL_LAB_CACHE, else
$XDG_CACHE_HOME/torch-fl/lab, else ~/.cache/torch-fl/lab, one directory per product named
`<kind>-<hash of inputs>`. A product is built in a temporary sibling directory and renamed into
place only when complete, so an interrupted build never leaves a half product that a later run
would trust.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Bump when a build recipe changes in a way its inputs do not capture.
RECIPE_VERSION = "1"
DONE_MARKER = "product.json"


def cache_root() -> Path:
    """Directory holding every cached lab product (and the running lab's state)."""
    explicit = os.environ.get("TORCH_FL_LAB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "torch-fl" / "lab"


def product_key(kind: str, inputs: dict[str, Any]) -> str:
    """Stable name for a product: its kind plus a hash of everything it is built from."""
    blob = json.dumps({"recipe": RECIPE_VERSION, "kind": kind, **inputs}, sort_keys=True)
    return f"{kind}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def lookup(kind: str, inputs: dict[str, Any]) -> Path | None:
    """The finished product directory for these inputs, or None."""
    path = cache_root() / product_key(kind, inputs)
    return path if (path / DONE_MARKER).is_file() else None


def get_or_build(
    kind: str, inputs: dict[str, Any], build: Callable[[Path], dict[str, Any]]
) -> tuple[Path, bool]:
    """Return (product dir, built_now). `build(tmpdir)` fills tmpdir and returns metadata.

    A per-product lock makes a second builder (another test session, `lab.up` in another
    shell) wait for the first and then reuse its product instead of building it twice.
    """
    found = lookup(kind, inputs)
    if found is not None:
        return found, False
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    final = root / product_key(kind, inputs)
    with open(root / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = lookup(kind, inputs)
        if found is not None:
            return found, False
        # Leftovers of builders that were killed before they could clean up.
        for stale in root.glob(f".{final.name}.*"):
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
        try:
            meta = build(tmp)
            (tmp / DONE_MARKER).write_text(
                json.dumps({"kind": kind, "inputs": inputs, **meta}, indent=2, sort_keys=True)
                + "\n"
            )
            if final.exists():  # an unfinished product (no marker) from an older run
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final, True


def metadata(product: Path) -> dict[str, Any]:
    return json.loads((product / DONE_MARKER).read_text())


# What this cache writes at its root: products (`<kind>-<hash>`), their locks and unfinished
# builds (`.<kind>-<hash>.lock`, `.<kind>-<hash>.<random>`), and two fixed directories.
_PRODUCT = re.compile(r"\.?[a-z0-9]+-[0-9a-f]{16}(\..+)?")
_FIXED = ("apt", "run")


def is_lab_entry(name: str) -> bool:
    return _PRODUCT.fullmatch(name) is not None or name in _FIXED


def clean(keep_running: Path | None = None) -> tuple[list[Path], list[Path]]:
    """Remove every cached product (not the state dir of a running lab): (removed, kept).

    Only names this cache writes go: TORCH_FL_LAB_CACHE pointed at a directory of one's own
    (`~`) must not lose its files. `apt` and `run` are plain words, so they go only when
    everything else there is the cache's too."""
    root = cache_root()
    removed: list[Path] = []
    kept: list[Path] = []
    if not root.is_dir():
        return removed, kept
    entries = sorted(root.iterdir())
    foreign = [e for e in entries if not is_lab_entry(e.name)]
    for entry in entries:
        if entry in foreign or (foreign and entry.name in _FIXED):
            kept.append(entry)
            continue
        if keep_running is not None and entry == keep_running:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed, kept

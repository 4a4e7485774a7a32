"""On-disk artifact cache: content-addressed, atomic, locked, self-checking.

Layout under the cache root ($FLAGOS_BPU_CACHE, default ~/.cache/torch-fl/bpu):
  artifacts/<key>/        model.onnx (the quantized graph), model.hbm (when compiled),
                          manifest.json (sha256 + size of every file, metadata); written last
  index/<graph_key>.json  {compiler_id: key}: lets a fresh process find its artifact from the
                          FX graph + weight bytes alone, with no ONNX export and no compiler call
  locks/<name>.lock       fcntl locks serialising builders of the same key across processes

`key` hashes the canonical quantized ONNX bytes, the march, the compiler identity and the
pipeline version, so op arguments, wiring and every weight byte change it. An entry is visible
only after os.replace of a complete directory, and a file whose sha256 no longer matches its
manifest is treated as missing (removed and rebuilt), never loaded.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "manifest.json"


def artifact_key(onnx_bytes: bytes, march: str, compiler_id: str, pipeline_version: str) -> str:
    h = hashlib.sha256()
    for part in (pipeline_version, march, compiler_id):
        h.update(part.encode())
        h.update(b"\0")
    h.update(onnx_bytes)
    return h.hexdigest()


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@dataclass(frozen=True)
class Artifact:
    """A verified cache entry."""

    key: str
    path: Path
    meta: dict

    def file(self, name: str) -> Path | None:
        candidate = self.path / name
        return candidate if name in self.meta.get("files", {}) else None


class ArtifactCache:
    """The cache rooted at `root`."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    # -- locking --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, name: str) -> Iterator[None]:
        path = self.root / "locks" / f"{name}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a+b") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    # -- artifacts ------------------------------------------------------------------------------
    def _dir(self, key: str) -> Path:
        return self.root / "artifacts" / key

    def get(self, key: str) -> Artifact | None:
        """The verified entry for `key`; a corrupt one is removed and reported as missing."""
        directory = self._dir(key)
        manifest = directory / MANIFEST
        try:
            meta = json.loads(manifest.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            self._discard(directory)
            return None
        for name, info in meta.get("files", {}).items():
            path = directory / name
            try:
                ok = path.stat().st_size == info["size"] and _sha256_file(path) == info["sha256"]
            except (OSError, KeyError, TypeError):
                ok = False
            if not ok:
                self._discard(directory)
                return None
        return Artifact(key, directory, meta)

    def _discard(self, directory: Path) -> None:
        # Move aside first so a concurrent reader never sees a half-deleted directory.
        trash = directory.with_name(f".trash-{directory.name}-{os.getpid()}-{time.time_ns()}")
        with contextlib.suppress(FileNotFoundError):
            os.replace(directory, trash)
            shutil.rmtree(trash, ignore_errors=True)

    def put(self, key: str, files: Mapping[str, bytes], meta: Mapping) -> Artifact:
        """Store a complete entry atomically (callers hold `lock(key)`)."""
        final = self._dir(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".tmp-{key[:16]}-"))
        try:
            listing = {}
            for name, data in files.items():
                (tmp / name).write_bytes(data)
                listing[name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
            manifest = dict(meta, key=key, files=listing, created=time.time())
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
            if final.exists():
                self._discard(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        artifact = self.get(key)
        if artifact is None:  # pragma: no cover - would mean the disk lies
            raise OSError(f"artifact {key} failed verification right after writing it")
        return artifact

    def get_or_build(
        self, key: str, build: Callable[[], tuple[Mapping[str, bytes], Mapping]]
    ) -> tuple[Artifact, bool]:
        """(artifact, built): build under the key's lock unless another process already did."""
        found = self.get(key)
        if found is not None:
            return found, False
        with self.lock(key):
            found = self.get(key)  # someone may have finished while we waited
            if found is not None:
                return found, False
            files, meta = build()
            return self.put(key, files, meta), True

    # -- index: graph key -> artifact keys -----------------------------------------------------
    def index_lookup(self, graph_key: str) -> dict[str, str]:
        try:
            data = json.loads((self.root / "index" / f"{graph_key}.json").read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def index_record(self, graph_key: str, compiler_id: str, key: str) -> None:
        with self.lock(f"index-{graph_key}"):
            data = self.index_lookup(graph_key)
            data[compiler_id] = key
            _atomic_write(
                self.root / "index" / f"{graph_key}.json",
                json.dumps(data, sort_keys=True).encode(),
            )

    # -- maintenance ----------------------------------------------------------------------------
    def entries(self) -> list[dict]:
        out = []
        base = self.root / "artifacts"
        if not base.is_dir():
            return out
        for directory in sorted(base.iterdir()):
            if directory.name.startswith("."):
                continue
            try:
                meta = json.loads((directory / MANIFEST).read_text())
            except (OSError, ValueError):
                meta = {"corrupt": True}
            size = sum(f.stat().st_size for f in directory.iterdir() if f.is_file())
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

    def clean(self, older_than_s: float | None = None) -> int:
        """Remove entries (all, or those older than `older_than_s`); return how many."""
        removed = 0
        now = time.time()
        for entry in self.entries():
            created = entry.get("created") or 0
            if older_than_s is not None and now - created < older_than_s:
                continue
            with self.lock(entry["key"]):
                self._discard(self._dir(entry["key"]))
            removed += 1
        if older_than_s is None:
            shutil.rmtree(self.root / "index", ignore_errors=True)
        return removed

"""On-disk artifact cache: content-addressed, atomic, locked, self-checking.

Layout under the cache root ($FLAGOS_BPU_CACHE, default ~/.cache/torch-fl/bpu):
  artifacts/<key>/        model.onnx (the quantized graph), model.hbm (when compiled),
                          manifest.json (sha256 + size of every file, metadata); written last
  index/<graph_key>.json  {compiler_id: key}: lets a fresh process find its artifact from the
                          FX graph + weight bytes alone, with no ONNX export and no compiler call
  locks/<name>.lock       fcntl locks serialising builders of the same key across processes

`key` hashes the graph key, the sha256 of the canonical quantized ONNX bytes, the march, the
compiler identity and the pipeline version, so op arguments, wiring and every weight byte change
it, and an artifact belongs to exactly one graph. An entry is visible only after os.replace of a
complete directory, and a file whose sha256 no longer matches its manifest is treated as missing
(removed and rebuilt), never loaded.

Nothing read from disk is trusted: keys must be sha256 hex digests (so no path can leave the
cache directory), manifests and index files must have the expected shape, and file names in a
manifest must be plain names. Anything else is discarded with a one-line warning and rebuilt.
A cache that cannot be written (a regular file in its place, read-only, full) raises one
`CacheError` naming the path and the fix; a failed write leaves nothing half-written.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from torch_fl import atomic
from torch_fl.bpu.cache_listing import (
    FILE_NAME as _FILE_NAME,
)
from torch_fl.bpu.cache_listing import (
    MANIFEST,
    is_key,
    list_entries,
)
from torch_fl.bpu.cache_listing import (
    valid_manifest as _valid_manifest,
)
from torch_fl.bpu.errors import CacheError


def artifact_key(
    onnx_sha256: str, march: str, compiler_id: str, pipeline_version: str, graph_key: str
) -> str:
    h = hashlib.sha256()
    for part in (pipeline_version, march, compiler_id, graph_key, onnx_sha256):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _warn(message: str) -> None:
    warnings.warn(f"torch_fl.bpu cache: {message}", RuntimeWarning, stacklevel=3)


def _fix(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC or exc.errno == errno.EDQUOT:
        return "free disk space, or point the cache elsewhere"
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        return "remove or rename that file, or point the cache elsewhere"
    return "make it writable, or point the cache elsewhere"


@contextlib.contextmanager
def writing(root: Path, what: str) -> Iterator[None]:
    """Turn an OSError while writing the cache into one CacheError naming the path and fix."""
    try:
        yield
    except CacheError:
        raise
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.EEXIST) or root.is_file():
            problem = f"{root} is not a directory (a regular file is in its place)"
        else:
            problem = f"cannot {what} under {root}: {exc.strerror or exc}"
        raise CacheError(
            exc.errno or errno.EIO,
            f"bpu cache: {problem}. Fix: {_fix(exc)} "
            "(options={'cache_dir': ...} or $FLAGOS_BPU_CACHE), or compile with "
            "options={'cache': False}",
        ) from None


def read_regular(path: Path) -> bytes:
    """The bytes of `path` if it is a regular file, not a symlink; else OSError.

    A FIFO or a link to /dev/zero in a hostile cache would block or never end; a link would read
    outside the cache directory.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return fh.read()


def _regular_size(path: Path) -> int:
    """st_size of `path` if it is a regular file, not a symlink; else OSError."""
    info = path.lstat()
    if not stat.S_ISREG(info.st_mode):
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return info.st_size


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
        with writing(self.root, "create a lock file"):
            path.parent.mkdir(parents=True, exist_ok=True)
            fh = open(path, "a+b")  # noqa: SIM115 - closed below, after the lock is released
        with fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    # -- artifacts ------------------------------------------------------------------------------
    def _dir(self, key: str) -> Path:
        return self.root / "artifacts" / key

    def get(self, key: str) -> Artifact | None:
        """The verified entry for `key`; a corrupt one is removed (with a warning) and reported
        as missing. A key that is not a hex digest is a miss that touches nothing."""
        if not is_key(key):
            return None
        directory = self._dir(key)
        manifest = directory / MANIFEST
        if directory.is_symlink():
            self._discard(directory, "the entry is a symbolic link, not a directory in the cache")
            return None
        try:
            meta = json.loads(read_regular(manifest).decode("utf-8"))
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            return None  # the cache root or artifacts/ is a file: put() reports it
        except (OSError, ValueError) as exc:
            self._discard(directory, f"unreadable manifest ({type(exc).__name__})")
            return None
        problem = _valid_manifest(meta, key)
        if problem:
            self._discard(directory, problem)
            return None
        for name, info in meta["files"].items():
            path = directory / name
            try:
                ok = (
                    _regular_size(path) == info["size"]
                    and atomic.sha256_file(path) == info["sha256"]
                )
            except OSError:
                ok = False
            if not ok:
                self._discard(directory, f"{name} does not match its manifest")
                return None
        return Artifact(key, directory, meta)

    def _discard(self, directory: Path, reason: str = "") -> None:
        # Only ever a directory directly under artifacts/ whose name is a key.
        if directory.parent != self.root / "artifacts" or not is_key(directory.name):
            raise ValueError(f"refusing to discard {directory}: not a cache entry")
        if reason:
            _warn(f"{directory}: {reason}; discarded, will rebuild")
        # Move aside first so a concurrent reader never sees a half-deleted directory.
        trash = directory.with_name(f".trash-{directory.name}-{os.getpid()}-{time.time_ns()}")
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            os.replace(directory, trash)
            if trash.is_symlink():
                trash.unlink()  # the link only: what it points to is not the cache's
            shutil.rmtree(trash, ignore_errors=True)

    def put(self, key: str, files: Mapping[str, bytes], meta: Mapping) -> Artifact:
        """Store a complete entry atomically (callers hold `lock(key)`)."""
        if not is_key(key):
            raise CacheError(errno.EINVAL, f"bpu cache: key {key!r:.80} is not a sha256 hex digest")
        for name in files:
            if not _FILE_NAME.fullmatch(name) or name == MANIFEST:
                raise CacheError(errno.EINVAL, f"bpu cache: {name!r} is not a plain file name")
        final = self._dir(key)
        with writing(self.root, "write an artifact"):
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".tmp-{key[:16]}-"))
            try:
                listing = {}
                for name, data in files.items():
                    (tmp / name).write_bytes(data)
                    listing[name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
                manifest = dict(meta, key=key, files=listing, created=time.time())
                (tmp / MANIFEST).write_bytes(
                    json.dumps(manifest, indent=1, sort_keys=True).encode()
                )
                if final.exists():
                    self._discard(final)
                os.replace(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        artifact = self.get(key)
        if artifact is None:  # pragma: no cover - would mean the disk lies
            raise CacheError(errno.EIO, f"bpu cache: {final} failed verification after writing")
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
        """{compiler_id: artifact key} for `graph_key`; malformed content is dropped (warned)."""
        if not is_key(graph_key):
            return {}
        path = self.root / "index" / f"{graph_key}.json"
        try:
            data = json.loads(read_regular(path).decode("utf-8"))
        except (FileNotFoundError, NotADirectoryError):
            return {}
        except (OSError, ValueError) as exc:
            _warn(f"{path}: unreadable index ({type(exc).__name__}); ignored, will rebuild")
            return {}
        if not isinstance(data, dict):
            _warn(f"{path}: index is a {type(data).__name__}, not an object; ignored")
            return {}
        good = {c: k for c, k in data.items() if isinstance(c, str) and is_key(k)}
        if len(good) != len(data):
            bad = sorted(str(c) for c in data if c not in good)
            _warn(f"{path}: index entries {bad} are not artifact keys; ignored, will rebuild")
        return good

    def index_record(self, graph_key: str, compiler_id: str, key: str) -> None:
        if not (is_key(graph_key) and is_key(key)):
            raise CacheError(errno.EINVAL, "bpu cache: index keys must be sha256 hex digests")
        with self.lock(f"index-{graph_key}"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # already reported by the lookup that missed
                data = self.index_lookup(graph_key)
            data[compiler_id] = key
            with writing(self.root, "write the index"):
                atomic.write_bytes(
                    self.root / "index" / f"{graph_key}.json",
                    json.dumps(data, sort_keys=True).encode(),
                )

    # -- maintenance ----------------------------------------------------------------------------
    def entries(self) -> list[dict]:
        return list_entries(self.root)

    def clean(self, older_than_s: float | None = None) -> int:
        """Remove entries (all, or those older than `older_than_s`); return how many."""
        removed = 0
        now = time.time()
        for entry in self.entries():
            created = entry.get("created") or 0
            if older_than_s is not None and now - created < older_than_s:
                continue
            if not is_key(entry["key"]):
                continue  # not ours: never delete what this cache did not write
            with self.lock(entry["key"]):
                self._discard(self._dir(entry["key"]))
            removed += 1
        if older_than_s is None:
            shutil.rmtree(self.root / "index", ignore_errors=True)
        return removed

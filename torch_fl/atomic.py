"""Replace a file all at once: a reader sees the old content or the new one, never a mix.

The data goes to a temporary file in the same directory (a rename is only atomic within one
file system) which is renamed over the destination when complete; on any failure, Ctrl-C
included, the temporary file is removed and the destination is untouched. Standard library only,
importing nothing from torch_fl: provisioning and scripts/ use it too (provision/floor/light.py).
`sha256_file` lives here too: it is how those same writers prove a file is the one they wrote.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to `path`; when the block succeeds it becomes `path`.

    For writers that need a file name rather than data (a compiler's `-o`, `cpio > file`).
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    # O_EXCL: never follow or reuse someone else's file; 0o666 lets the umask decide the mode,
    # as a plain open() would (mkstemp's 0o600 would make shared files private).
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        yield tmp
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes(path: str | os.PathLike[str], data: bytes, mode: int | None = None) -> None:
    """Write `data` to `path` atomically (synced to disk first); `mode` sets its permissions."""
    with replacing(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)


def write_text(path: str | os.PathLike[str], text: str, mode: int | None = None) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    write_bytes(path, text.encode("utf-8"), mode)


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The hex sha256 of a file's content, read in 1 MiB blocks (artifacts can be large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

"""One run at a time: an exclusive flock on a file, given up when its process ends.

An flock belongs to the open file: however the holder ends (exit, Ctrl-C, SIGKILL) the kernel
releases it, so no stale lock file ever has to be cleaned up by hand. Trying without waiting
turns a second, concurrent run into a clear error instead of two runs writing the same files.
"""

from __future__ import annotations

import fcntl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def held(path: Path, busy: Callable[[], Exception]) -> Iterator[None]:
    """Hold an exclusive lock on `path` for the block; raise `busy()` when another process
    holds it already (its parent directory is created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise busy() from None
        yield

"""Checks for output paths given on the command line, run before any work starts.

A report path that turns out to be a directory, or to lie under a regular file, must fail in the
first second with the flag and the fix, not after a twenty-minute run with a traceback.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

_ABSENT = (errno.ENOENT, errno.ENOTDIR)
NAME_MAX, PATH_MAX = 255, 4096  # Linux's limits, in bytes, on one name and on a whole path


def shown(value: object, limit: int = 80) -> str:
    """`repr(value)`, cut short when long: a 5000-character value must not flood the one line."""
    text = repr(str(value))
    if len(text) <= limit:
        return text
    return f"{text[: limit - 1]}…' ({len(str(value))} characters)"


def lookup_problem(path: Path | str) -> str | None:
    """Why `path` cannot even be looked up (a name too long, a symlink loop, no permission to
    search); None when it can, existing or not. Path.exists() raises for these instead."""
    try:
        raw = os.fsencode(path)
        longest = max(len(part) for part in raw.split(b"/"))
        if longest > NAME_MAX:
            return (
                f"cannot be used as a path (a name in it is {longest} bytes long; the limit is "
                f"{NAME_MAX}); choose a shorter path"
            )
        if len(raw) >= PATH_MAX:
            return (
                f"cannot be used as a path ({len(raw)} bytes long; the limit is {PATH_MAX - 1}); "
                "choose a shorter path"
            )
        os.stat(path)
    except OSError as err:
        if err.errno in _ABSENT:
            return None
        return f"cannot be used as a path ({err.strerror}); choose another path"
    except ValueError:  # an embedded NUL byte
        return "cannot be used as a path (it holds a NUL byte); choose another path"
    return None


def _existing_ancestor(path: Path) -> Path:
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return probe


def dir_problem(path: Path) -> str | None:
    """Why `path` cannot be (or become) a writable directory; None when it can."""
    problem = lookup_problem(path)
    if problem:
        return problem
    probe = _existing_ancestor(path)
    if probe.exists() and not probe.is_dir():
        return f"{probe} is a file, not a directory; choose another path"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable; choose another path"
    try:  # root passes os.access() everywhere, yet cannot create files in /proc or on a ro mount
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".torch-fl-probe-"):
            pass
    except OSError as err:
        return f"{probe} is not writable ({err.strerror}); choose another path"
    return None


def file_problem(path: Path) -> str | None:
    """Why a file cannot be written at `path`; None when it can."""
    if not str(path).strip():
        return "is empty; give a file path"
    problem = lookup_problem(path)
    if problem:
        return problem
    if path.is_dir():
        return "is a directory; give a file path (for example inside it: DIR/report.json)"
    if path.exists() and not path.is_file():
        # The report is written beside and renamed over its path: a FIFO, a device (/dev/null
        # as root) or a socket there would be replaced by a regular file, not written to.
        return f"is {_special_kind(path)}, not a regular file; give a file path (- for standard output)"
    parent_problem = dir_problem(path.parent)
    if parent_problem:
        return parent_problem
    if path.exists() and not os.access(path, os.W_OK):
        return "is not writable; choose another path"
    return None


def _special_kind(path: Path) -> str:
    mode = os.stat(path).st_mode
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"

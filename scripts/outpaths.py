"""Checks for output paths given on the command line, run before any work starts.

A report path that turns out to be a directory, or to lie under a regular file, must fail in the
first second with the flag and the fix, not after a twenty-minute run with a traceback.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _existing_ancestor(path: Path) -> Path:
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return probe


def dir_problem(path: Path) -> str | None:
    """Why `path` cannot be (or become) a writable directory; None when it can."""
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
    if path.is_dir():
        return "is a directory; give a file path (for example inside it: DIR/report.json)"
    parent_problem = dir_problem(path.parent)
    if parent_problem:
        return parent_problem
    if path.exists() and not os.access(path, os.W_OK):
        return "is not writable; choose another path"
    return None

"""The per-user environment file that provisioning writes and torch_fl reads by itself.

Provisioning knows where the x86_64 Python, the emulator and the cache live; writing them to a file
means nobody has to `export` anything before `import torch_fl`. Real environment variables always
win over the file, so a one-off override needs no edit.

This module is the file format's one home: provisioning writes with `render_env_text` and
compares with `parse_env_text`. Standard library only, importing nothing from torch_fl, so
provisioning and the test matrix load it by file (provision/floor/light.py).
"""

from __future__ import annotations

import os
import stat as stat_mode
import warnings
from collections.abc import Mapping
from pathlib import Path

ENV_FILE_VAR = "FLAGOS_BPU_ENV_FILE"
HEADER = "# Written by `invoke provision`; real environment variables override these values.\n"


def env_file_path() -> Path:
    """Where the env file lives: $FLAGOS_BPU_ENV_FILE, else $XDG_CONFIG_HOME/torch-fl/env."""
    explicit = os.environ.get(ENV_FILE_VAR)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "torch-fl" / "env"


REPAIR = "fix the line or re-run `invoke provision --only envfile`"


def _parse_line(raw: str) -> tuple[str, str] | None | str:
    """(key, value), None for a blank/comment line, or a problem description."""
    line = raw.strip()
    if not line or line.startswith("#"):
        return None
    if line.startswith("export "):
        line = line[len("export ") :].strip()
    key, sep, value = line.partition("=")
    key = key.strip()
    if not sep or not key.isidentifier():
        return f"expected KEY=VALUE, got {raw!r}"
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1]
    return key, value


def parse_env_text(text: str, source: str = "<env file>") -> dict[str, str]:
    """Parse `KEY=VALUE` lines; `#` starts a comment; surrounding quotes are stripped.

    Strict: the first bad line raises ValueError naming `source`, the line and the fix
    (provisioning uses this to decide that a file must be rewritten).
    """
    values: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        parsed = _parse_line(raw)
        if isinstance(parsed, str):
            raise ValueError(f"{source}:{lineno}: {parsed}; {REPAIR}")
        if parsed is not None:
            values[parsed[0]] = parsed[1]
    return values


def render_env_text(values: Mapping[str, str], header: str = HEADER) -> str:
    """The file text for `values`, sorted by key; `parse_env_text` reads back exactly `values`."""
    lines = [header]
    for key, value in sorted(values.items()):
        if not key.isidentifier() or "\n" in value or "\r" in value:
            raise ValueError(f"cannot write {key}={value!r} to the env file: one KEY=VALUE a line")
        if value != value.strip() or value[:1] in "'\"":
            value = f'"{value}"'  # parse_env_text strips blanks and one pair of quotes
        lines.append(f"{key}={value}\n")
    return "".join(lines)


def load_env_file(path: Path | None = None) -> dict[str, str]:
    """Read the env file strictly; a missing file is an empty configuration, not an error."""
    target = path or env_file_path()
    try:
        text = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    return parse_env_text(text, source=str(target))


_warned: set[tuple] = set()


def _warn_once(path: Path, stamp: tuple, message: str) -> None:
    key = (str(path), stamp, message)
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(f"torch_fl: {message}", RuntimeWarning, stacklevel=4)


def read_env_file(path: Path | None = None) -> dict[str, tuple[str, int]]:
    """Lenient read for every program that imports torch: {KEY: (value, line number)}.

    Whatever the file holds (bad lines, non-UTF-8 bytes, binary data, a directory in its place)
    this never raises: it warns once per file state, naming the file and line and the fix, and
    keeps every good line.
    """
    target = path or env_file_path()
    data: bytes | None = None
    try:
        stat = target.stat()
        if stat_mode.S_ISREG(stat.st_mode):
            data = target.read_bytes()
        elif stat_mode.S_ISDIR(stat.st_mode):
            kind = "is a directory"
        else:  # reading a FIFO or a device (/dev/zero) would block every import, or never end
            kind = "is not a regular file"
    except FileNotFoundError:
        return {}
    except OSError as exc:
        kind = f"cannot be read ({exc.strerror})"
    if data is None:
        _warn_once(
            target,
            (),
            f"env file {target} {kind}; ignoring it. Fix: remove it or re-run "
            "`invoke provision --only envfile`",
        )
        return {}
    values: dict[str, tuple[str, int]] = {}
    problems: list[str] = []
    data = data.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark, as some editors save
    for lineno, raw_bytes in enumerate(data.splitlines(), start=1):
        try:
            raw = raw_bytes.decode("utf-8")
        except UnicodeDecodeError:
            problems.append(f"{target}:{lineno}: not UTF-8 text")
            continue
        parsed = _parse_line(raw)
        if isinstance(parsed, str):
            problems.append(f"{target}:{lineno}: {parsed[:120]}")
        elif parsed is not None:
            values[parsed[0]] = (parsed[1], lineno)
    if problems:
        more = f" (and {len(problems) - 1} more bad line(s))" if len(problems) > 1 else ""
        _warn_once(
            target,
            (stat.st_mtime_ns, stat.st_size),
            f"{problems[0]}{more}; ignoring bad lines. Fix: {REPAIR}",
        )
    return values


def lookup(name: str) -> tuple[str | None, str]:
    """(value, where it came from): `$NAME`, `<env file>:<line>`, or (None, "") when unset."""
    if name in os.environ:
        return os.environ[name], f"${name}"
    path = env_file_path()
    found = read_env_file(path).get(name)
    if found is None:
        return None, ""
    return found[0], f"{path}:{found[1]}"


def get(name: str, default: str | None = None) -> str | None:
    """A setting: the real environment first, then the env file, then `default`.

    Read at call time (not import time) so a changed environment or file takes effect at once.
    A malformed env file never raises here (see `read_env_file`).
    """
    value, _ = lookup(name)
    return default if value is None else value

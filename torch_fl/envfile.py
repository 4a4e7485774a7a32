"""The per-user environment file that provisioning writes and torch_fl reads by itself.

Provisioning knows where the x86_64 Python, the emulator and the cache live; writing them to a file
means nobody has to `export` anything before `import torch_fl`. Real environment variables always
win over the file, so a one-off override needs no edit.

This module is the file format's one home: provisioning writes with `render_env_text` and
compares with `parse_env_text`. Standard library only, importing nothing from torch_fl, so
provisioning and the test matrix load it by file (provision/light.py).
"""

from __future__ import annotations

import os
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


def parse_env_text(text: str, source: str = "<env file>") -> dict[str, str]:
    """Parse `KEY=VALUE` lines; `#` starts a comment; surrounding quotes are stripped."""
    values: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].strip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise ValueError(
                f"{source}:{lineno}: expected KEY=VALUE, got {raw!r}; "
                "fix the line or re-run `invoke provision --only envfile`"
            )
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key] = value
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
    """Read the env file; a missing file is an empty configuration, not an error."""
    target = path or env_file_path()
    try:
        text = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    return parse_env_text(text, source=str(target))


def get(name: str, default: str | None = None) -> str | None:
    """A setting: the real environment first, then the env file, then `default`.

    Read at call time (not import time) so a changed environment or file takes effect at once.
    """
    if name in os.environ:
        return os.environ[name]
    return load_env_file().get(name, default)

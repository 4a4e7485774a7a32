"""Provisioning configuration: packaged defaults, overlaid by invoke.yaml and `--config FILE`.

provision.yaml holds the defaults; `load` overlays the overrides (each key checked against the
typed fields of provision/settings.py, a typo an error with a guess) and parses the result into
`settings.Settings`, whose field declarations check every value up front: a typo fails in a
second with the key and the fix, not after a twenty-minute box64 build.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from provision import settings
from provision.settings import DEFAULTS_PATH, MARCHES, ConfigError, Settings, parse
from provision.step_names import STEP_NAMES

__all__ = [
    "DEFAULTS_PATH",
    "MARCHES",
    "STEP_NAMES",
    "ConfigError",
    "Settings",
    "check_keys",
    "deep_merge",
    "defaults",
    "invoke_section",
    "load",
    "parse",
    "read_yaml_mapping",
]


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def read_yaml_mapping(path: Path, label: str = "config file") -> dict[str, Any]:
    """A YAML file holding a mapping (empty: {}). Each way it can be wrong is one ConfigError
    naming `label` (how the user knows the file: "config file", "--farm-config") and the path."""
    try:
        if path.exists() and not path.is_dir() and not path.is_file():
            # a FIFO or a device would block the read (or never end): refuse it unread
            raise ConfigError(f"{label} {path} is not a regular file; give the YAML file")
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"{label} {path} does not exist; fix the path") from exc
    except IsADirectoryError as exc:
        raise ConfigError(f"{label} {path} is a directory; give the YAML file") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{label} {path} is not UTF-8 text (byte {exc.start}); give a YAML file"
        ) from exc
    except OSError as exc:
        raise ConfigError(f"{label} {path} cannot be read ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        where = " ".join(str(exc).split())  # PyYAML's text spans lines; the error is one
        raise ConfigError(f"{label} {path} is not valid YAML: {where}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{label} {path} must hold a mapping at top level")
    return data


def check_keys(over: Any, source: str, cls: type = Settings, prefix: str = "") -> None:
    """Every key of an override must be a field of the settings: a typo is an error with a
    guess, a value of the wrong kind (a number for a path) an error naming the key."""
    if not isinstance(over, dict):
        return
    for key, value in over.items():
        dotted = f"{prefix}{key}"
        fix = settings.unknown_key(key, cls, prefix)
        if fix:
            raise ConfigError(f"{source}: unknown key {dotted!r}; {fix}")
        kind = settings.types_of(cls)[key]
        problem = settings.kind_problem(value, kind)
        if problem:
            raise ConfigError(f"{source}: {dotted} = {value!r}: {problem}")
        if settings.is_section(kind):
            check_keys(value, source, kind, f"{dotted}.")


def defaults() -> dict[str, Any]:
    """provision.yaml as a mapping: the packaged defaults, before any override."""
    return read_yaml_mapping(DEFAULTS_PATH)


def invoke_section(value: Any, name: str) -> dict[str, Any] | None:
    """invoke.yaml's `name:` section as a dict (None when absent); anything else is an error."""
    if value is None:
        return None
    if not hasattr(value, "keys"):  # invoke hands mappings over as DataProxy, not dict
        raise ConfigError(
            f"invoke.yaml: the {name} section must be a mapping of keys, got {value!r}"
        )
    return dict(value)


def load(config_file: str | None = None, invoke_section: dict[str, Any] | None = None) -> Settings:
    """Defaults <- invoke.yaml `provision:` section <- --config file, parsed and checked."""
    cfg = defaults()
    if invoke_section:
        check_keys(dict(invoke_section), "invoke.yaml provision section")
        cfg = deep_merge(cfg, dict(invoke_section))
    if config_file is not None:
        if not str(config_file).strip():
            # An empty value ("$UNSET") must not quietly mean "the packaged defaults".
            raise ConfigError("--config '' is empty; give the YAML file (or leave the flag out)")
        path = Path(config_file).expanduser()
        over = read_yaml_mapping(path)
        check_keys(over, f"config file {path}")
        cfg = deep_merge(cfg, over)
    return parse(cfg)

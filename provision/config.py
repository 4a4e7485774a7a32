"""Provisioning configuration: packaged defaults, overlaid by invoke.yaml and `--config FILE`.

Values are validated up front so a typo fails in a second with the key and the fix, not after a
twenty-minute box64 build.
"""

from __future__ import annotations

import copy
import difflib
import math
import re
from pathlib import Path
from typing import Any

import yaml

from provision import box64 as box64_logic
from provision.floor import light
from provision.steps import STEP_NAMES

MARCHES: tuple[str, ...] = light.load("targets").MARCHES

DEFAULTS_PATH = Path(__file__).with_name("provision.yaml")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
# What the bpu compile backend targets: an env file naming anything else breaks every compile.
_MARCHES = {"auto", *MARCHES}


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the key and the fix."""


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


def check_keys(over: Any, defaults: Any, source: str, prefix: str = "") -> None:
    """Every key of an override must exist in the defaults: a typo is an error with a guess."""
    if not isinstance(over, dict) or not isinstance(defaults, dict):
        return
    for key, value in over.items():
        dotted = f"{prefix}{key}"
        if key not in defaults:
            close = difflib.get_close_matches(str(key), [str(k) for k in defaults], n=1)
            hint = (
                f"did you mean {prefix}{close[0]}?"
                if close
                else (f"known keys here: {', '.join(sorted(str(k) for k in defaults))}")
            )
            raise ConfigError(f"{source}: unknown key {dotted!r}; {hint}")
        kind = _kind_problem(value, defaults[key])
        if kind:
            raise ConfigError(f"{source}: {dotted} = {value!r}: {kind}")
        check_keys(value, defaults[key], source, f"{dotted}.")


def _kind_problem(value: Any, default: Any) -> str | None:
    """Why `value` cannot stand where the packaged default is `default` (None: it can).

    A number where a path belongs, or NaN as a timeout, would otherwise surface as a traceback
    (or a hang) deep inside a step.
    """
    if isinstance(default, dict):
        return None if isinstance(value, dict) else "use a mapping of keys, like the default"
    if isinstance(default, bool):
        return None if isinstance(value, bool) else "use true or false"
    if isinstance(default, (int, float)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "use a number"
        return None if math.isfinite(value) else "use a finite number"
    if isinstance(default, list):
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return None
        return "use a list of strings (quote each item)"
    if isinstance(default, str) and not isinstance(value, str):
        return "use a string (quote it)"
    return None


def _get(cfg: dict[str, Any], dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(f"config key {dotted} is missing; restore it from {DEFAULTS_PATH}")
        node = node[part]
    return node


def _check_pin(cfg: dict[str, Any], key: str) -> None:
    sha = _get(cfg, f"{key}.sha256")
    url = _get(cfg, f"{key}.url")
    name = _get(cfg, f"{key}.filename")
    if not isinstance(sha, str) or not _SHA_RE.match(sha):
        raise ConfigError(
            f"{key}.sha256 = {sha!r} is not a 64-digit lowercase hex sha256; set it to "
            f"`sha256sum {name}` of the file published at {url}"
        )
    if not isinstance(url, str) or not url.startswith("https://"):
        raise ConfigError(f"{key}.url = {url!r} must be an https:// URL of {name}")
    if not isinstance(name, str) or not name or "/" in name:
        raise ConfigError(f"{key}.filename = {name!r} must be a plain file name")


_PIN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][A-Za-z0-9.+!-]*$")
_RANGE_RE = re.compile(r"^\s*(>=|<=|==|>|<)\s*[0-9]+(\.[0-9]+)*\s*$")


def _check_torch_env(cfg: dict[str, Any]) -> None:
    """The board environment's pins: a typo here would only fail inside pip on the board."""
    source = _get(cfg, "torch_env.torch.source")
    if source not in ("auto", "wheelhouse", "index", "distro"):
        raise ConfigError(
            f"torch_env.torch.source = {source!r}: use auto, wheelhouse, index or distro"
        )
    version = _get(cfg, "torch_env.torch.version")
    if not re.match(r"^[0-9]+(\.[0-9]+){1,2}$", str(version)):
        raise ConfigError(f"torch_env.torch.version = {version!r}: a release like 2.13.0")
    supported = str(_get(cfg, "torch_env.torch.supported"))
    if not supported.strip() or not all(_RANGE_RE.match(c) for c in supported.split(",")):
        raise ConfigError(
            f"torch_env.torch.supported = {supported!r}: comparisons separated by commas, "
            "like >=2.10,<2.15"
        )
    url = _get(cfg, "torch_env.torch.index_url")
    if not str(url).startswith(("https://", "file://")):
        raise ConfigError(f"torch_env.torch.index_url = {url!r}: an https:// (or file://) URL")
    for pin in _get(cfg, "torch_env.wheels"):
        if not _PIN_RE.match(pin):
            raise ConfigError(
                f"torch_env.wheels: {pin!r} is not pinned; write name==version (numpy==2.4.6)"
            )


def validate(cfg: dict[str, Any]) -> dict[str, Any]:
    """Raise ConfigError for the first bad value; return cfg unchanged when fine."""
    min_box64 = _get(cfg, "policy.min_box64")
    try:
        box64_logic.parse_policy(str(min_box64))
    except ValueError as exc:
        raise ConfigError(f"policy.min_box64: {exc}") from exc
    _check_pin(cfg, "box64.source")
    _check_pin(cfg, "x86_python.tarball")
    mb = _get(cfg, "box64.source.mb_per_job")
    if not isinstance(mb, int) or mb < 256:
        raise ConfigError(f"box64.source.mb_per_job = {mb!r}: use an integer >= 256 (MB)")
    if not isinstance(_get(cfg, "box64.source.cmake_extra"), list):
        raise ConfigError("box64.source.cmake_extra must be a list of -D flags")
    source = _get(cfg, "x86_python.source")
    if source not in ("auto", "tarball", "distro"):
        raise ConfigError(f"x86_python.source = {source!r}: use auto, tarball or distro")
    march = _get(cfg, "march")
    if march not in _MARCHES:
        raise ConfigError(f"march = {march!r}: use one of {sorted(_MARCHES)}")
    if _get(cfg, "default_march") not in _MARCHES - {"auto"}:
        raise ConfigError(f"default_march must be one of {sorted(_MARCHES - {'auto'})}")
    skip = _get(cfg, "steps.skip")
    if not isinstance(skip, list) or any(s not in STEP_NAMES for s in skip):
        raise ConfigError(f"steps.skip = {skip!r}: a list of step names from {list(STEP_NAMES)}")
    _check_torch_env(cfg)
    for key in (
        "x86_python.import_timeout_s",
        "build_verify.timeout_s",
        "ssh.connect_timeout_s",
        "torch_env.timeout_s",
        "torch_fl.build_timeout_s",
    ):
        value = _get(cfg, key)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not 0 < value < math.inf
        ):
            raise ConfigError(f"{key} = {value!r}: use a positive number of seconds")
    return cfg


def invoke_section(value: Any, name: str) -> dict[str, Any] | None:
    """invoke.yaml's `name:` section as a dict (None when absent); anything else is an error."""
    if value is None:
        return None
    if not hasattr(value, "keys"):  # invoke hands mappings over as DataProxy, not dict
        raise ConfigError(
            f"invoke.yaml: the {name} section must be a mapping of keys, got {value!r}"
        )
    return dict(value)


def load(config_file: str | None = None, invoke_section: dict[str, Any] | None = None) -> dict:
    """Defaults <- invoke.yaml `provision:` section <- --config file; validated."""
    cfg = read_yaml_mapping(DEFAULTS_PATH)
    defaults = copy.deepcopy(cfg)
    if invoke_section:
        check_keys(dict(invoke_section), defaults, "invoke.yaml provision section")
        cfg = deep_merge(cfg, dict(invoke_section))
    if config_file is not None:
        if not str(config_file).strip():
            # An empty value ("$UNSET") must not quietly mean "the packaged defaults".
            raise ConfigError("--config '' is empty; give the YAML file (or leave the flag out)")
        path = Path(config_file).expanduser()
        over = read_yaml_mapping(path)
        check_keys(over, defaults, f"config file {path}")
        cfg = deep_merge(cfg, over)
    return validate(cfg)

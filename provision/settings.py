"""Provisioning's configuration, typed: every key of provision.yaml declared once, as a field.

provision.yaml holds the defaults (the commented file users copy); invoke.yaml's `provision:`
section and `--config FILE` overlay it (provision/config.py). `parse` turns the merged mapping
into a frozen `Settings`, which steps read as attributes (`ctx.config.torch_env.torch.version`).
Each field carries its type (which gives the kind check: a string, a number, a list of strings,
a mapping), the check of its value where there is one, and a one-line doc. Checks raise
ConfigError naming the key and the fix, so a typo fails in a second, not after a twenty-minute
box64 build. tests/unit/test_provision_settings.py keeps the fields and provision.yaml in step.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

from provision import box64 as box64_logic
from provision.floor import light
from provision.step_names import STEP_NAMES

MARCHES: tuple[str, ...] = light.load("targets").MARCHES
DEFAULTS_PATH = Path(__file__).with_name("provision.yaml")
# What the bpu compile backend targets: an env file naming anything else breaks every compile.
_MARCHES = {"auto", *MARCHES}
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_PIN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][A-Za-z0-9.+!-]*$")
_RANGE_RE = re.compile(r"^\s*(>=|<=|==|>|<)\s*[0-9]+(\.[0-9]+)*\s*$")


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the key and the fix."""


# A field's check: (value, its dotted key, the raw mapping of its section) -> the parsed value.
Check = Callable[[Any, str, Mapping[str, Any]], Any]
Strings = tuple[str, ...]  # a YAML list of strings


def setting(doc: str, check: Check | None = None) -> Any:
    """Declare a field: its one-line doc and, beyond its type, the check of its value."""
    return field(metadata={"doc": doc, "check": check})


def section(doc: str) -> Any:
    """Declare a nested section (a mapping in provision.yaml); its type is a dataclass."""
    return field(metadata={"doc": doc, "check": None})


# -- checks ---------------------------------------------------------------------------------


def _one_of(*choices: str) -> Check:
    def check(value: Any, key: str, raw: Mapping[str, Any]) -> str:
        if value not in choices:
            said = f"{', '.join(choices[:-1])} or {choices[-1]}"
            raise ConfigError(f"{key} = {value!r}: use {said}")
        return value

    return check


def _seconds(value: Any, key: str, raw: Mapping[str, Any]) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigError(f"{key} = {value!r}: use a positive number of seconds")
    return float(value)


def _min_box64(value: Any, key: str, raw: Mapping[str, Any]) -> str:
    try:
        box64_logic.parse_policy(str(value))
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}") from exc
    return value


def _sha256(value: Any, key: str, raw: Mapping[str, Any]) -> str:
    if not isinstance(value, str) or not _SHA_RE.match(value):
        raise ConfigError(
            f"{key} = {value!r} is not a 64-digit lowercase hex sha256; set it to "
            f"`sha256sum {raw.get('filename')}` of the file published at {raw.get('url')}"
        )
    return value


def _https(value: Any, key: str, raw: Mapping[str, Any]) -> str:
    if not isinstance(value, str) or not value.startswith("https://"):
        raise ConfigError(f"{key} = {value!r} must be an https:// URL of {raw.get('filename')}")
    return value


def _file_name(value: Any, key: str, raw: Mapping[str, Any]) -> str:
    if not isinstance(value, str) or not value or "/" in value:
        raise ConfigError(f"{key} = {value!r} must be a plain file name")
    return value


def _mb_per_job(value: Any, key: str, raw: Mapping[str, Any]) -> int:
    if not isinstance(value, int) or value < 256:
        raise ConfigError(f"{key} = {value!r}: use an integer >= 256 (MB)")
    return value


def _march(value: Any, key: str, raw: Mapping[str, Any]) -> str:
    if value not in _MARCHES:
        raise ConfigError(f"{key} = {value!r}: use one of {sorted(_MARCHES)}")
    return value


def _default_march(value: Any, key: str, raw: Mapping[str, Any]) -> str:
    if value not in _MARCHES - {"auto"}:
        raise ConfigError(f"{key} must be one of {sorted(_MARCHES - {'auto'})}")
    return value


def _step_names(value: Any, key: str, raw: Mapping[str, Any]) -> list[str]:
    if any(name not in STEP_NAMES for name in value):
        raise ConfigError(f"{key} = {value!r}: a list of step names from {list(STEP_NAMES)}")
    return value


def _release(value: Any, key: str, raw: Mapping[str, Any]) -> str:
    if not re.match(r"^[0-9]+(\.[0-9]+){1,2}$", str(value)):
        raise ConfigError(f"{key} = {value!r}: a release like 2.13.0")
    return value


def _version_range(value: Any, key: str, raw: Mapping[str, Any]) -> str:
    text = str(value)
    if not text.strip() or not all(_RANGE_RE.match(c) for c in text.split(",")):
        raise ConfigError(f"{key} = {text!r}: comparisons separated by commas, like >=2.10,<2.15")
    return value


def _index_url(value: Any, key: str, raw: Mapping[str, Any]) -> str:
    if not str(value).startswith(("https://", "file://")):
        raise ConfigError(f"{key} = {value!r}: an https:// (or file://) URL")
    return value


def _pinned(value: Any, key: str, raw: Mapping[str, Any]) -> list[str]:
    for pin in value:
        if not _PIN_RE.match(pin):
            raise ConfigError(f"{key}: {pin!r} is not pinned; write name==version (numpy==2.4.6)")
    return value


# -- the layout -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Pin:
    """A pinned download: found in --artifacts or fetched, always checked by its sha256."""

    version: str = setting("the release the file holds")
    sha256: str = setting("`sha256sum` of the file (64 lowercase hex digits)", _sha256)
    url: str = setting("where the file is published (https://)", _https)
    filename: str = setting("the file's name, also looked for in --artifacts", _file_name)


@dataclass(frozen=True)
class Box64Source(Pin):
    """box64's source release, built into the project prefix when no good box64 exists."""

    cmake_extra: Strings = setting("extra cmake flags for the board (e.g. a CPU preset)")
    mb_per_job: int = setting(
        "memory per parallel compile job; -j is min(cpus, mem / this)", _mb_per_job
    )


@dataclass(frozen=True)
class Box64:
    path: str = setting("explicit box64 to use (skips discovery); empty: prefix, then PATH")
    allow_distro: bool = setting("accept the package manager's box64 when it meets the policy")
    source: Box64Source = section("the pinned box64 source release")


@dataclass(frozen=True)
class X86Distro:
    candidates: Strings = setting("x86_64 interpreters tried on aarch64 targets, in order")
    packages: Strings = setting("installed (multiarch) when no candidate exists and forced")


@dataclass(frozen=True)
class X86Python:
    source: str = setting(
        "auto | tarball | distro: where the x86_64 Python comes from",
        _one_of("auto", "tarball", "distro"),
    )
    tarball: Pin = section("the pinned self-contained x86_64 CPython")
    distro: X86Distro = section("an x86_64 interpreter from the distribution")
    native_python: str = setting("on x86_64 targets: the interpreter a native venv is made from")
    hbdk4_requirements: Strings = setting("hbdk4 wheels to install from --oe-wheels (names)")
    import_timeout_s: float = setting("seconds for the hbdk4 import check", _seconds)


@dataclass(frozen=True)
class Policy:
    min_box64: str = setting("oldest box64 accepted (MAJOR.MINOR.PATCH)", _min_box64)


@dataclass(frozen=True)
class TorchPins:
    source: str = setting(
        "auto | wheelhouse | index | distro: where the board's torch comes from",
        _one_of("auto", "wheelhouse", "index", "distro"),
    )
    version: str = setting("the torch release installed from a wheelhouse or index", _release)
    index_url: str = setting("the package index torch comes from (PyTorch's CPU one)", _index_url)
    distro_packages: Strings = setting("installed with apt when source is distro and no torch")
    supported: str = setting(
        "torch releases torch-fl builds against, like >=2.10,<2.15", _version_range
    )


@dataclass(frozen=True)
class TorchEnv:
    python: str = setting("the board's interpreter the torch-env venv is made from")
    torch: TorchPins = section("where torch comes from and which releases are accepted")
    wheels: Strings = setting("what torch-fl needs beside torch, pinned name==version", _pinned)
    timeout_s: float = setting("seconds for each pip install into the venv", _seconds)


@dataclass(frozen=True)
class TorchFl:
    build_timeout_s: float = setting("seconds for building torch-fl's wheel on the board", _seconds)


@dataclass(frozen=True)
class BuildVerify:
    build_command: str = setting("builds the extension in the project root ({python})")
    fallback_build_command: str = setting("used when the project has no `invoke build` task")
    timeout_s: float = setting("seconds for the build and for the verification", _seconds)


@dataclass(frozen=True)
class Steps:
    skip: Strings = setting("steps left out of every run (--only still runs them)", _step_names)


@dataclass(frozen=True)
class Ssh:
    known_hosts: str = setting("known_hosts file for host keys, read beside ~/.ssh/known_hosts")
    identity: str = setting("private key to log in with; empty: the SSH agent and ~/.ssh keys")
    connect_timeout_s: float = setting("seconds to wait for an SSH connection", _seconds)


@dataclass(frozen=True)
class Settings:
    """The whole provisioning configuration, as `Context.config` hands it to the steps."""

    prefix: str = setting("project-owned install root on the target ({data_home}, ...)")
    policy: Policy = section("what an existing install must meet")
    box64: Box64 = section("the x86_64 emulator on aarch64 targets")
    x86_python: X86Python = section("the x86_64 Python hbdk4 runs in")
    march: str = setting("BPU architecture for the env file; auto: from the board model", _march)
    default_march: str = setting("the march for hosts, whose model names no BPU", _default_march)
    cache_dir: str = setting("the bpu compile cache on the target ({cache_home}, ...)")
    torch_env: TorchEnv = section("the board's Python environment for torch-fl")
    torch_fl: TorchFl = section("torch-fl built on the board")
    build_verify: BuildVerify = section("building and proving the extension")
    steps: Steps = section("which steps run")
    ssh: Ssh = section("how remote targets are reached")


# -- parsing --------------------------------------------------------------------------------

T = TypeVar("T")


@functools.cache
def types_of(cls: type) -> dict[str, Any]:
    """A section's field types, resolved (the annotations are strings)."""
    return get_type_hints(cls)


def is_section(kind: Any) -> bool:
    return isinstance(kind, type) and dataclasses.is_dataclass(kind)


def kind_problem(value: Any, kind: Any) -> str | None:
    """Why `value` cannot stand in a field of type `kind` (None: it can).

    A number where a path belongs, or NaN as a timeout, would otherwise surface as a traceback
    (or a hang) deep inside a step.
    """
    if is_section(kind):
        return None if isinstance(value, dict) else "use a mapping of keys, like the default"
    if kind is bool:
        return None if isinstance(value, bool) else "use true or false"
    if kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "use a number"
        return None if math.isfinite(value) else "use a finite number"
    if kind == Strings:
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return None
        return "use a list of strings (quote each item)"
    if kind is str and not isinstance(value, str):
        return "use a string (quote it)"
    return None


def unknown_key(key: Any, cls: type, prefix: str) -> str | None:
    """How to fix `key`, when section `cls` has no such field (None: it has)."""
    names = types_of(cls)
    if key in names:
        return None
    close = difflib.get_close_matches(str(key), list(names), n=1)
    if close:
        return f"did you mean {prefix}{close[0]}?"
    return f"known keys here: {', '.join(sorted(names))}"


def parse(raw: Mapping[str, Any]) -> Settings:
    """The merged configuration as `Settings`; ConfigError for the first bad key or value."""
    return _parse_section(Settings, raw, "")


def _parse_section(cls: type[T], raw: Mapping[str, Any], prefix: str) -> T:
    for key in raw:
        fix = unknown_key(key, cls, prefix)
        if fix:
            dotted = f"{prefix}{key}"
            raise ConfigError(f"configuration: unknown key {dotted!r}; {fix}")
    values: dict[str, Any] = {}
    for item in dataclasses.fields(cls):  # type: ignore[arg-type]
        dotted, kind = f"{prefix}{item.name}", types_of(cls)[item.name]
        if item.name not in raw:
            raise ConfigError(f"config key {dotted} is missing; restore it from {DEFAULTS_PATH}")
        value = raw[item.name]
        problem = kind_problem(value, kind)
        if problem:
            raise ConfigError(f"{dotted} = {value!r}: {problem}")
        if is_section(kind):
            values[item.name] = _parse_section(kind, value, f"{dotted}.")
            continue
        check = item.metadata["check"]
        parsed = check(value, dotted, raw) if check else value
        values[item.name] = tuple(parsed) if isinstance(parsed, list) else parsed
    return cls(**values)


def all_fields(cls: type = Settings, prefix: str = "") -> dict[str, dataclasses.Field]:
    """Every field by its dotted key, sections included: what provision.yaml must hold."""
    out: dict[str, dataclasses.Field] = {}
    for item in dataclasses.fields(cls):  # type: ignore[arg-type]
        dotted, kind = f"{prefix}{item.name}", types_of(cls)[item.name]
        out[dotted] = item
        if is_section(kind):
            out.update(all_fields(kind, f"{dotted}."))
    return out

"""All options of the `bpu` backend, with every default in one place.

Resolution order, per field: `torch.compile(..., options={...})` > `FLAGOS_BPU_*` environment
variable (or the provisioning env file, via `torch_fl.envfile.get`) > the default below. The
environment is read when a model is compiled, never at import time, so changing it takes effect
for the next compilation without restarting Python.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch_fl import envfile
from torch_fl.bpu.errors import SettingsError
from torch_fl.targets import MARCHES

EXECUTORS = ("auto", "hbm", "sim", "eager")
DRIVERS = ("auto", "native", "emulated", "none")
CALIBRATE_MODES = ("none", "first-call")
CALIB_METHODS = ("max", "percentile")
ON_STALE = ("recompile", "eager")
SIM_WEIGHTS = ("live", "checked")
REPORT_FORMATS = ("none", "table", "json")
COMPILE_ARTIFACT = ("auto", "always", "never")


def _default_cache_dir() -> str:
    return os.path.join(os.path.expanduser("~"), ".cache", "torch-fl", "bpu")


@dataclass(frozen=True)
class BpuSettings:
    """Every knob of the backend. Frozen: a compiled graph keeps the settings it was built with."""

    executor: str = "auto"
    """`auto` (hbm on a board, else eager with one warning), `hbm`, `sim` (ORT int8) or `eager`."""
    quantize: bool = True
    """Insert int8 Q/DQ; False produces float artifacts (which hbdk4 lowers to the CPU)."""
    act_scale: float = 0.05
    """Activation scale used where no calibration data exists."""
    calibration: Any = None
    """A `Calibration` object or a path to its JSON, applied to every partition."""
    calibrate: str = "none"
    """`first-call`: calibrate each partition on the inputs of its first real call."""
    calib_method: str = "max"
    calib_percentile: float = 99.99
    march: str = "nash-e"
    cache_dir: str = field(default_factory=_default_cache_dir)
    cache: bool = True
    strict: bool = False
    """Raise for any compute node or partition not offloaded (hbm or an explicit sim)."""
    min_partition_ops: int = 1
    """Partitions with fewer compute ops stay on the CPU (submission overhead dominates)."""
    on_stale: str = "recompile"
    """What to do when frozen weights changed in place: rebuild the partition or run eager."""
    report: str = "none"
    driver: str = "auto"
    compile_artifact: str = "auto"
    """Whether to run hbdk4: `auto` = when the executor is hbm; `always` (x86 host pre-compile)."""
    compile_timeout: float = 3600.0
    opt_level: int = 2
    sim_threads: int = 0
    """ONNX Runtime intra-op threads for the sim executor; 0 = ORT's default."""
    sim_weights: str = "live"
    """`live`: the sim graph reads the weights as inputs every call (never stale by construction;
    ORT cannot pre-pack them). `checked`: weights baked in like an artifact, every byte compared
    before each call and the partition rebuilt (on_stale) when any changed."""

    def replace(self, **changes: Any) -> BpuSettings:
        return dataclasses.replace(self, **changes)


def max_sim_threads() -> int:
    """The most ORT threads a sim executor may ask for: 4 per CPU this process may run on.

    More only adds contention; a typo like 99999 made ORT start that many threads and grow by
    gigabytes a minute.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return 4 * max(cpus, 1)


def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if not isinstance(value, (str, int)):
        raise ValueError(f"expected a boolean, got {type(value).__name__}")
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected a boolean")


def _choice(choices: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {type(value).__name__}")
        text = value.strip().lower()
        if text not in choices:
            raise ValueError("not one of the choices")
        return text

    return parse


def _number(value: Any) -> float:
    """A finite real number from a number or its text; bools are not numbers here."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str, numbers.Real)):
        raise ValueError(f"expected a number, got {type(value).__name__}")
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError("not a number") from None
    if not math.isfinite(number):
        raise ValueError("not a finite number")
    return number


def _float_in(low: float, high: float, low_open: bool = False) -> Callable[[Any], float]:
    def parse(value: Any) -> float:
        number = _number(value)
        if number > high or number < low or (low_open and number == low):
            raise ValueError("out of range")
        return number

    return parse


def _int_in(low: int, high: Callable[[], int] | int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        number = _number(value)
        if number != int(number):
            raise ValueError("not an integer")
        top = high() if callable(high) else high
        if not low <= number <= top:
            raise ValueError("out of range")
        return int(number)

    return parse


def _path(value: Any) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"expected a directory path, got {type(value).__name__}")
    text = os.fspath(value)
    if isinstance(text, bytes) or not text.strip() or "\0" in text:
        raise ValueError("expected a non-empty directory path")
    # absolute now: a later chdir must not move the cache
    return os.path.abspath(os.path.expanduser(text))


def _report(value: Any) -> str:
    if value is None or value is False:
        return "none"
    if value is True:
        return "table"
    return _choice(REPORT_FORMATS)(value)


def _calibration(value: Any) -> Any:
    from torch_fl.bpu.conversion.calibration import Calibration

    if value is None or isinstance(value, Calibration):
        return value
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"expected a Calibration or a path, got {type(value).__name__}")
    path = os.path.expanduser(os.fspath(value))
    if os.path.isdir(path):
        raise ValueError(f"{path} is a directory, not a calibration JSON file")
    try:
        return Calibration.load(path)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path} is not a calibration file ({exc})") from None


# field -> (parser, environment variable or None, allowed values for the error message)
_FIELDS: dict[str, tuple[Callable[[Any], Any], str | None, str]] = {
    "executor": (_choice(EXECUTORS), "FLAGOS_BPU_EXECUTOR", "|".join(EXECUTORS)),
    "quantize": (_parse_bool, "FLAGOS_BPU_QUANTIZE", "bool"),
    "act_scale": (_float_in(1e-6, 1e6), "FLAGOS_BPU_ACT_SCALE", "a number in [1e-6, 1e6]"),
    "calibration": (_calibration, None, "a Calibration or the path of its JSON file"),
    "calibrate": (_choice(CALIBRATE_MODES), "FLAGOS_BPU_CALIBRATE", "|".join(CALIBRATE_MODES)),
    "calib_method": (_choice(CALIB_METHODS), None, "|".join(CALIB_METHODS)),
    "calib_percentile": (_float_in(50.0, 100.0, low_open=True), None, "a number in (50, 100]"),
    "march": (_choice(MARCHES), "FLAGOS_BPU_MARCH", "|".join(MARCHES)),
    "cache_dir": (_path, "FLAGOS_BPU_CACHE", "a directory path (str or os.PathLike)"),
    "cache": (_parse_bool, None, "bool"),
    "strict": (_parse_bool, "FLAGOS_BPU_STRICT", "bool"),
    "min_partition_ops": (_int_in(0, 1_000_000), None, "an integer in [0, 1000000]"),
    "on_stale": (_choice(ON_STALE), None, "|".join(ON_STALE)),
    "report": (_report, "FLAGOS_BPU_REPORT", "|".join(REPORT_FORMATS) + " | bool"),
    "driver": (_choice(DRIVERS), "FLAGOS_BPU_DRIVER", "|".join(DRIVERS)),
    "compile_artifact": (
        _choice(COMPILE_ARTIFACT),
        "FLAGOS_BPU_COMPILE_ARTIFACT",
        "|".join(COMPILE_ARTIFACT),
    ),
    "compile_timeout": (
        _float_in(0.0, 7 * 86400.0, low_open=True),
        "FLAGOS_BPU_COMPILE_TIMEOUT",
        "seconds in (0, 604800]",
    ),
    "opt_level": (_int_in(0, 2), None, "0|1|2"),
    "sim_weights": (_choice(SIM_WEIGHTS), "FLAGOS_BPU_SIM_WEIGHTS", "|".join(SIM_WEIGHTS)),
    "sim_threads": (
        _int_in(0, max_sim_threads),
        "FLAGOS_BPU_SIM_THREADS",
        "an integer in [0, 4 x CPUs] (0 = ORT's default)",
    ),
}

ENV_VARS: dict[str, str] = {env: name for name, (_, env, _) in _FIELDS.items() if env}


def valid_options() -> str:
    """One line per option: name, accepted values, environment variable."""
    lines = []
    for name, (_, env, allowed) in _FIELDS.items():
        lines.append(f"  {name}: {allowed}" + (f"  (env {env})" if env else ""))
    return "\n".join(lines)


def _allowed(name: str) -> str:
    allowed = _FIELDS[name][2]
    if name == "sim_threads":
        allowed = f"an integer in [0, {max_sim_threads()}] (0 = ORT's default; 4 x CPUs)"
    return allowed


def _parse(name: str, value: Any, source: str) -> Any:
    parser = _FIELDS[name][0]
    try:
        return parser(value)
    except (TypeError, ValueError, OverflowError) as exc:
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise SettingsError(
            f"bpu backend: bad value {shown} for option {name} (from {source}): {exc}; "
            f"valid: {_allowed(name)}"
        ) from None


def parse_option(name: str, value: Any, source: str) -> Any:
    """One option's value checked as `resolve` checks it; `source` names where it came from."""
    return _parse(name, value, source)


def resolve(options: Mapping[str, Any] | None = None) -> BpuSettings:
    """Build the settings for one compilation from defaults, env and `options`."""
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise SettingsError(
            "bpu backend: options must be a dict of option -> value, got "
            f"{type(options).__name__} ({options!r:.60}). Example: options={{'executor': 'sim'}}"
        )
    options = dict(options)
    unknown = sorted(str(k) for k in set(options) - set(_FIELDS))
    if unknown:
        raise SettingsError(
            f"bpu backend: unknown option(s) {', '.join(unknown)}. Valid options:\n"
            f"{valid_options()}"
        )
    values: dict[str, Any] = {}
    for name, (_, env, _) in _FIELDS.items():
        if name in options:
            values[name] = _parse(name, options[name], "options")
        elif env is not None:
            raw, where = envfile.lookup(env)
            if raw is not None and raw != "":
                source = where if where.startswith("$") else f"env file {where}, {env}"
                values[name] = _parse(name, raw, source)
    return BpuSettings(**values)

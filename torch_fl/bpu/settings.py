"""All options of the `bpu` backend, with every default in one place.

Resolution order, per field: `torch.compile(..., options={...})` > `FLAGOS_BPU_*` environment
variable (or the provisioning env file, via `torch_fl.envfile.get`) > the default below. The
environment is read when a model is compiled, never at import time, so changing it takes effect
for the next compilation without restarting Python.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch_fl import envfile
from torch_fl.targets import MARCHES

EXECUTORS = ("auto", "hbm", "sim", "eager")
DRIVERS = ("auto", "native", "emulated", "none")
CALIBRATE_MODES = ("none", "first-call")
CALIB_METHODS = ("max", "percentile")
ON_STALE = ("recompile", "eager")
REPORT_FORMATS = ("none", "table", "json")
COMPILE_ARTIFACT = ("auto", "always", "never")


class SettingsError(ValueError):
    """An unknown option or a value the backend cannot use."""


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

    def replace(self, **changes: Any) -> BpuSettings:
        return dataclasses.replace(self, **changes)


def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected a boolean (1/0, true/false, yes/no, on/off)")


def _choice(choices: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        text = str(value).strip().lower()
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return text

    return parse


def _positive_float(value: Any) -> float:
    number = float(value)
    if not number > 0:
        raise ValueError("expected a number > 0")
    return number


def _non_negative_int(value: Any) -> int:
    if isinstance(value, bool) or int(value) != float(value):
        raise ValueError("expected an integer")
    number = int(value)
    if number < 0:
        raise ValueError("expected an integer >= 0")
    return number


def _percentile(value: Any) -> float:
    number = float(value)
    if not 50.0 < number <= 100.0:
        raise ValueError("expected a percentile in (50, 100]")
    return number


def _path(value: Any) -> str:
    text = os.path.expanduser(str(value))
    if not text:
        raise ValueError("expected a directory path")
    return text


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
    if isinstance(value, (str, os.PathLike)):
        return Calibration.load(value)
    raise ValueError("expected a torch_fl.bpu.Calibration or the path of its JSON file")


# field -> (parser, environment variable or None, allowed values for the error message)
_FIELDS: dict[str, tuple[Callable[[Any], Any], str | None, str]] = {
    "executor": (_choice(EXECUTORS), "FLAGOS_BPU_EXECUTOR", "|".join(EXECUTORS)),
    "quantize": (_parse_bool, "FLAGOS_BPU_QUANTIZE", "bool"),
    "act_scale": (_positive_float, "FLAGOS_BPU_ACT_SCALE", "float > 0"),
    "calibration": (_calibration, None, "Calibration | path to JSON"),
    "calibrate": (_choice(CALIBRATE_MODES), "FLAGOS_BPU_CALIBRATE", "|".join(CALIBRATE_MODES)),
    "calib_method": (_choice(CALIB_METHODS), None, "|".join(CALIB_METHODS)),
    "calib_percentile": (_percentile, None, "float in (50, 100]"),
    "march": (_choice(MARCHES), "FLAGOS_BPU_MARCH", "|".join(MARCHES)),
    "cache_dir": (_path, "FLAGOS_BPU_CACHE", "directory path"),
    "cache": (_parse_bool, None, "bool"),
    "strict": (_parse_bool, "FLAGOS_BPU_STRICT", "bool"),
    "min_partition_ops": (_non_negative_int, None, "int >= 0"),
    "on_stale": (_choice(ON_STALE), None, "|".join(ON_STALE)),
    "report": (_report, "FLAGOS_BPU_REPORT", "|".join(REPORT_FORMATS) + " | bool"),
    "driver": (_choice(DRIVERS), "FLAGOS_BPU_DRIVER", "|".join(DRIVERS)),
    "compile_artifact": (
        _choice(COMPILE_ARTIFACT),
        "FLAGOS_BPU_COMPILE_ARTIFACT",
        "|".join(COMPILE_ARTIFACT),
    ),
    "compile_timeout": (_positive_float, "FLAGOS_BPU_COMPILE_TIMEOUT", "seconds > 0"),
    "opt_level": (_non_negative_int, None, "int >= 0"),
    "sim_threads": (_non_negative_int, "FLAGOS_BPU_SIM_THREADS", "int >= 0"),
}

ENV_VARS: dict[str, str] = {env: name for name, (_, env, _) in _FIELDS.items() if env}


def valid_options() -> str:
    """One line per option: name, accepted values, environment variable."""
    lines = []
    for name, (_, env, allowed) in _FIELDS.items():
        lines.append(f"  {name}: {allowed}" + (f"  (env {env})" if env else ""))
    return "\n".join(lines)


def _parse(name: str, value: Any, source: str) -> Any:
    parser = _FIELDS[name][0]
    try:
        return parser(value)
    except (TypeError, ValueError) as exc:
        raise SettingsError(
            f"bpu backend: bad value {value!r} for {name} (from {source}): {exc}. "
            f"Valid options:\n{valid_options()}"
        ) from None


def resolve(options: dict[str, Any] | None = None) -> BpuSettings:
    """Build the settings for one compilation from defaults, env and `options`."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(_FIELDS))
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
            raw = envfile.get(env)
            if raw is not None and raw != "":
                values[name] = _parse(name, raw, f"${env}")
    return BpuSettings(**values)

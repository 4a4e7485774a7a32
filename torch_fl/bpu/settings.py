"""All options of the `bpu` backend, with every default in one place.

Resolution order, per field: `torch.compile(..., options={...})` > `FLAGOS_BPU_*` environment
variable (or the provisioning env file, via `torch_fl.envfile.get`) > the default below. The
environment is read when a model is compiled, never at import time, so changing it takes effect
for the next compilation without restarting Python.
"""

from __future__ import annotations

import dataclasses
import difflib
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
CALIBRATE_MODES = ("auto", "first-call", "require", "none")
CALIB_METHODS = ("max", "percentile", "kl", "mse", "auto")
ON_STALE = ("recompile", "eager")
SIM_WEIGHTS = ("live", "checked")
SIM_KERNELS = ("auto", "u8s8", "mixed", "u8u8", "float")
SIM_THREAD_CHOICE = ("measured", "fixed")
REPORT_FORMATS = ("none", "table", "json")
COMPILE_ARTIFACT = ("auto", "always", "never")


def _default_cache_dir() -> str:
    from torch_fl.bpu.cache_listing import default_cache_dir

    return default_cache_dir()


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; os.cpu_count() where none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def max_sim_threads() -> int:
    """The most ORT threads a sim executor may ask for: 4 per CPU this process may run on.

    More only adds contention; a typo like 99999 made ORT start that many threads and grow by
    gigabytes a minute.
    """
    return 4 * max(usable_cpus(), 1)


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
            close = difflib.get_close_matches(text, choices, n=1)
            raise ValueError(
                "not one of the choices" + (f" (did you mean {close[0]!r}?)" if close else "")
            )
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


def _patterns(value: Any) -> tuple[str, ...]:
    """Layer selectors: a list of strings (or one comma-separated string, as an env var gives):
    module-path globs (`features.3.*`), op types (`Conv`, `Gemm`, `MatMul`) or ONNX tensor
    names."""
    if value is None:
        return ()
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")]
        items = [v for v in items if v]
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
    else:
        raise ValueError(f"expected a list of module patterns, got {type(value).__name__}")
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise ValueError(f"each pattern must be a non-empty string, got {item!r}")
    return tuple(sorted({i.strip() for i in items}))


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


@dataclass(frozen=True)
class Option:
    """What one settings field accepts: its parser, its environment variable, its doc."""

    parse: Callable[[Any], Any]
    allowed: str
    """The accepted values, as an error message names them."""
    doc: str
    env: str | None = None
    """The `FLAGOS_BPU_*` variable (or env file key) that sets it; None: option only."""


def _option(
    default: Any,
    parse: Callable[[Any], Any],
    allowed: str,
    doc: str,
    env: str | None = None,
    factory: Callable[[], Any] | None = None,
) -> Any:
    meta = {"option": Option(parse, allowed, doc, env)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class BpuSettings:
    """Every knob of the backend. Frozen: a compiled graph keeps the settings it was built with.

    Each field carries its parser, environment variable and doc (`option(name)`); docs/compile.md
    and docs/env-vars.md list them, and tests/compile/test_settings_docs.py keeps the tables true.
    """

    executor: str = _option(
        "auto",
        _choice(EXECUTORS),
        "|".join(EXECUTORS),
        "`auto` (hbm on a board, else eager with one warning), `hbm`, `sim` (ORT int8) or `eager`.",
        "FLAGOS_BPU_EXECUTOR",
    )
    quantize: bool = _option(
        True,
        _parse_bool,
        "bool",
        "Insert int8 Q/DQ; False produces float artifacts (which hbdk4 lowers to the CPU).",
        "FLAGOS_BPU_QUANTIZE",
    )
    act_scale: float = _option(
        0.05,
        _float_in(1e-6, 1e6),
        "a number in [1e-6, 1e6]",
        "Activation scale used where no calibration data exists.",
        "FLAGOS_BPU_ACT_SCALE",
    )
    calibration: Any = _option(
        None,
        _calibration,
        "a Calibration or the path of its JSON file",
        "A `Calibration` object or a path to its JSON, applied to every partition.",
    )
    calibrate: str = _option(
        "auto",
        _choice(CALIBRATE_MODES),
        "|".join(CALIBRATE_MODES),
        "What an int8 partition does when no calibration is stored for it (calibration is found "
        "again after recompiles and restarts: `calibration` option, this process's calibrations, "
        "the cache). `auto`: calibrate on its first call's inputs and warn once, naming the "
        "partition; `first-call`: the same without the warning; `require`: raise "
        "CalibrationError; `none`: run with the default `act_scale` and warn once.",
        "FLAGOS_BPU_CALIBRATE",
    )
    calib_method: str = _option(
        "max",
        _choice(CALIB_METHODS),
        "|".join(CALIB_METHODS),
        "How calibration turns observed activations into scales (conversion/thresholds.py): "
        "`max`, `percentile`, `kl` (entropy), `mse` (least squared error), `auto` (per tensor, "
        "the one of those with the least error).",
    )
    calib_percentile: float = _option(
        99.99,
        _float_in(50.0, 100.0, low_open=True),
        "a number in (50, 100]",
        "The percentile of |activation| the `percentile` method keeps.",
    )
    bias_correction: bool = _option(
        False,
        _parse_bool,
        "bool",
        "calibrate() also corrects each Conv / Gemm bias by the mean int8 error of its output "
        "channels on the samples, per layer only where that raises the layer's own cosine "
        "(conversion/bias_correction.py); calibrate(bias_correction=...) overrides it.",
    )
    march: str = _option(
        "nash-e",
        _choice(MARCHES),
        "|".join(MARCHES),
        "The BPU micro-architecture artifacts are compiled for.",
        "FLAGOS_BPU_MARCH",
    )
    cache_dir: str = _option(
        None,
        _path,
        "a directory path (str or os.PathLike)",
        "The artifact cache directory (made absolute when resolved).",
        "FLAGOS_BPU_CACHE",
        factory=_default_cache_dir,
    )
    cache: bool = _option(True, _parse_bool, "bool", "Use the on-disk artifact cache.")
    strict: bool = _option(
        False,
        _parse_bool,
        "bool",
        "Raise for any compute node or partition not offloaded (hbm or an explicit sim).",
        "FLAGOS_BPU_STRICT",
    )
    min_partition_ops: int = _option(
        1,
        _int_in(0, 1_000_000),
        "an integer in [0, 1000000]",
        "Partitions with fewer compute ops stay on the CPU (submission overhead dominates).",
    )
    max_shapes: int = _option(
        8,
        _int_in(1, 1024),
        "an integer in [1, 1024]",
        "Static input shapes (batch sizes, resolutions) one compiled graph builds BPU artifacts "
        "for; a shape beyond them runs on the host with one warning.",
        "FLAGOS_BPU_MAX_SHAPES",
    )
    on_stale: str = _option(
        "recompile",
        _choice(ON_STALE),
        "|".join(ON_STALE),
        "What to do when frozen weights changed in place: rebuild the partition or run eager.",
    )
    report: str = _option(
        "none",
        _report,
        "|".join(REPORT_FORMATS) + " | bool",
        "Print the coverage report (table or JSON) to stderr when a graph compiles.",
        "FLAGOS_BPU_REPORT",
    )
    driver: str = _option(
        "auto",
        _choice(DRIVERS),
        "|".join(DRIVERS),
        "Which hbdk4 compiler driver to use: found automatically, or forced.",
        "FLAGOS_BPU_DRIVER",
    )
    compile_artifact: str = _option(
        "auto",
        _choice(COMPILE_ARTIFACT),
        "|".join(COMPILE_ARTIFACT),
        "Whether to run hbdk4: `auto` = when the executor is hbm; `always` (x86 host pre-compile).",
        "FLAGOS_BPU_COMPILE_ARTIFACT",
    )
    compile_timeout: float = _option(
        3600.0,
        _float_in(0.0, 7 * 86400.0, low_open=True),
        "seconds in (0, 604800]",
        "Seconds one hbdk4 run may take before it is killed.",
        "FLAGOS_BPU_COMPILE_TIMEOUT",
    )
    opt_level: int = _option(2, _int_in(0, 2), "0|1|2", "hbdk4's optimisation level (`opt`).")
    sim_threads: int = _option(
        0,
        _int_in(0, max_sim_threads),
        "an integer in [0, 4 x CPUs] (0 = every CPU / ORT's default)",
        "ONNX Runtime intra-op threads for the sim executor: the most it may use with "
        "sim_thread_choice='measured' (0: every CPU this process may run on), exactly that many "
        "with 'fixed' (0: ORT's default).",
        "FLAGOS_BPU_SIM_THREADS",
    )
    sim_thread_choice: str = _option(
        "measured",
        _choice(SIM_THREAD_CHOICE),
        "|".join(SIM_THREAD_CHOICE),
        "`measured`: on its first call each sim partition times its session at 1, half and all "
        "of sim_threads threads, adds the weight check where a count leaves no CPU free for it, "
        "and runs the fastest; its next 24 calls run the two fastest in blocks in turn, timed "
        "whole, and the faster of those is kept (explain() shows both timings). `fixed`: "
        "exactly sim_threads.",
        "FLAGOS_BPU_SIM_THREAD_CHOICE",
    )
    sim_weights: str = _option(
        "checked",
        _choice(SIM_WEIGHTS),
        "|".join(SIM_WEIGHTS),
        "`checked`: weights baked into the sim session (pre-packed for the int8 kernels), each "
        "one's identity and 128-bit content fingerprint checked at every call, and the "
        "partition rebuilt (on_stale) when any changed. `live`: the sim graph reads the weights "
        "as inputs and quantizes them on every call (never stale by construction, float kernels "
        "only).",
        "FLAGOS_BPU_SIM_WEIGHTS",
    )
    weight_watch: bool = _option(
        True,
        _parse_bool,
        "bool",
        "With baked weights: the kernel tracks writes to their pages (userfaultfd's asynchronous "
        "write protection read by PAGEMAP_SCAN, Linux 6.7+) and each call hashes only pages "
        "written since the last call (and weights too small to be worth a scan); where the "
        "kernel or a sandbox refuses, or for shared or file-mapped memory, every call hashes those "
        "weights whole (explain() says which). False: always hash every weight.",
        "FLAGOS_BPU_WEIGHT_WATCH",
    )
    fast_guards: bool = _option(
        True,
        _parse_bool,
        "bool",
        "Build the Dynamo guards of the frames this backend compiles with Dynamo's recursive "
        "dict-tag check (`torch._dynamo.config.use_recursive_dict_tags_for_guards`, for those "
        "frames only): a call compares the version tags of the module dicts instead of running "
        "every guard, until one changes. False: Dynamo's default guards.",
        "FLAGOS_BPU_FAST_GUARDS",
    )
    sim_kernels: str = _option(
        "auto",
        _choice(SIM_KERNELS),
        "|".join(SIM_KERNELS),
        "Kernels the sim executor runs the int8 graph with. `auto`: the fastest exact path for "
        "this CPU (u8s8 with VNNI, else mixed, else u8u8, else float), each checked by a "
        "saturation probe. `mixed`: u8s8 for ops reading Relu'd (non-negative) tensors, u8u8 "
        "elsewhere. `u8s8`/`mixed`/`u8u8`: that fused integer path (an error if its probe is not "
        "exact here). "
        "`float`: Q/DQ as float rounding steps around float kernels.",
        "FLAGOS_BPU_SIM_KERNELS",
    )
    sim_lookups: bool = _option(
        True,
        _parse_bool,
        "bool",
        "In the sim's fused integer graph, run each elementwise float chain between 8-bit "
        "tensors (hardswish, SiLU, GELU, a squeeze-excitation scale) as one table lookup over "
        "its input bytes: the table is the chain's own float result for every "
        "input, so the numbers are the float path's (conversion/lookups.py); a float lookup "
        "and the ReduceMean over it as one op (conversion/lookup_mean.py); an 8-bit concat "
        "with the lookups that feed it as one pass of per-input tables "
        "(conversion/concat_lookup.py). False: ONNX Runtime's dequantize, float kernels and "
        "quantize, and its QLinearConcat.",
        "FLAGOS_BPU_SIM_LOOKUPS",
    )
    sim_depthwise: bool = _option(
        True,
        _parse_bool,
        "bool",
        "In the sim's fused integer graph, run each depthwise int8 conv whose channel count ONNX "
        "Runtime's kernels handle slowly (not a multiple of 16), and each grouped int8 conv of "
        "groups 2 to 16 channels wide (which ORT runs as one small GEMM a group), on the "
        "extension's own ops: exact float multiply-adds over the integers, or AVX512-VNNI byte "
        "dot products into QLinearConv's own int32, then ORT's requantization, so the bytes are "
        "QLinearConv's (conversion/depthwise.py, grouped_conv.py). The depthwise ones where the "
        "CPU has AVX-512 or AVX2, the grouped ones where it has AVX-512. Also each 8-bit GEMM of "
        "one row (a classifier at batch 1) and each 1x1 int8 conv over one pixel (a "
        "squeeze-excitation block's at batch 1) on AVX512-VNNI byte dot products split over "
        "the session's threads, QGemm's and QLinearConv's bytes (conversion/gemv.py), "
        "and each 8-bit max pool ONNX Runtime leaves channels-first (its generic loop) on the "
        "extension's pool op, on every CPU (conversion/max_pool.py). False: ONNX Runtime's "
        "QLinearConv, QGemm and MaxPool run them all.",
        "FLAGOS_BPU_SIM_DEPTHWISE",
    )
    sim_narrow_op: bool = _option(
        True,
        _parse_bool,
        "bool",
        "In the sim's fused integer graph, run each int8 conv over at most 4 input channels and "
        "64 outputs (an image stem) on the extension's own op: AVX512-VNNI byte dot products, "
        "or AVX2 16-bit ones (up to 32 outputs), giving QLinearConv's int32 accumulator, then "
        "ORT's requantization, so the bytes are QLinearConv's (conversion/narrow_op.py). "
        "Elsewhere, or False, the narrow convs' exact float form (conversion/narrow_convs.py).",
        "FLAGOS_BPU_SIM_NARROW_OP",
    )
    sim_pair_gemm: bool = _option(
        True,
        _parse_bool,
        "bool",
        "In the sim's fused integer graph, where its kernels are ONNX Runtime's u8u8 ones (an x86 "
        "CPU without VNNI) and the CPU has AVX2 but no AVX-512, run each 1x1 int8 conv (stride 1, no pads) and each 8-bit "
        "GEMM with uint8 weights on the extension's own op: AVX2's exact 16-bit products into "
        "the ORT op's own int32, then its output step, so the bytes are ORT's "
        "(conversion/pair_gemm.py). False: ORT's QLinearConv and QGemm run them.",
        "FLAGOS_BPU_SIM_PAIR_GEMM",
    )
    # last: the field named `float` shadows the builtin in the rest of the class body
    int16: tuple = _option(
        (),
        _patterns,
        "a list of module globs / op types",
        "Layers whose input activations stay int16 (module-path globs such as `features.3.*`, op "
        "types such as `Conv`, or ONNX tensor names), whatever calibration chose: hb_compile's "
        "node_info. Weights stay int8.",
        "FLAGOS_BPU_INT16",
    )
    dual_int16: tuple = _option(
        (),
        _patterns,
        "a list of module globs / op types",
        "Layers whose input activations and weights are int16 (HMCT's dual int16: Conv, Gemm, "
        "MatMul), named as for `int16`; wins over `int16`.",
        "FLAGOS_BPU_DUAL_INT16",
    )
    float: tuple = _option(
        (),
        _patterns,
        "a list of module globs / op types",
        "Layers that run in float (on the CPU: hbdk4 lowers an op without Q/DQ there), inputs and "
        "weights: TensorRT's torch_executed_ops. Wins over `int16` and `dual_int16`.",
        "FLAGOS_BPU_FLOAT",
    )

    def replace(self, **changes: Any) -> BpuSettings:
        return dataclasses.replace(self, **changes)


def option(name: str) -> Option:
    """The parser, environment variable and doc of the settings field `name`."""
    return _FIELDS[name]


_FIELDS: dict[str, Option] = {f.name: f.metadata["option"] for f in dataclasses.fields(BpuSettings)}

ENV_VARS: dict[str, str] = {o.env: name for name, o in _FIELDS.items() if o.env}


def valid_options() -> str:
    """One line per option: name, accepted values, environment variable."""
    lines = []
    for name, o in _FIELDS.items():
        lines.append(f"  {name}: {o.allowed}" + (f"  (env {o.env})" if o.env else ""))
    return "\n".join(lines)


def _allowed(name: str) -> str:
    allowed = _FIELDS[name].allowed
    if name == "sim_threads":
        allowed = f"an integer in [0, {max_sim_threads()}] (0 = ORT's default; 4 x CPUs)"
    return allowed


def _parse(name: str, value: Any, source: str) -> Any:
    parser = _FIELDS[name].parse
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
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, list(_FIELDS), n=1)
            if close:
                hints.append(f"{name!r}: did you mean {close[0]!r}?")
        hint = (" (" + "; ".join(hints) + ")") if hints else ""
        raise SettingsError(
            f"bpu backend: unknown option(s) {', '.join(unknown)}{hint}. Valid options:\n"
            f"{valid_options()}"
        )
    values: dict[str, Any] = {}
    for name, o in _FIELDS.items():
        env = o.env
        if name in options:
            values[name] = _parse(name, options[name], "options")
        elif env is not None:
            raw, where = envfile.lookup(env)
            if raw is not None and raw != "":
                source = where if where.startswith("$") else f"env file {where}, {env}"
                values[name] = _parse(name, raw, source)
    return BpuSettings(**values)

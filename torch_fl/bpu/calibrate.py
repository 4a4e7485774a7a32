"""Public calibration API: observe sample inputs, feed the scales into every partition.

The scales also go into the calibration store (conversion/calibration_store.py), keyed by each
partition's graph, weights and method, so a recompile (`torch._dynamo.reset()`, a guard
failure, a new batch size) or a new process using the same cache finds them again.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from torch_fl._progress import Heartbeat
from torch_fl.bpu.conversion import calibration_store as stored
from torch_fl.bpu.conversion.calibration import Calibration, RangeObserver
from torch_fl.bpu.errors import CalibrationError, CalibrationRunError
from torch_fl.bpu.runtime import partition as runtime
from torch_fl.bpu.settings import parse_option
from torch_fl.host_view import cpu_views, device_of, to_device


class _Session:
    def __init__(self, method: str, percentile: float, bias: bool | None = None) -> None:
        self.method = method
        self.percentile = percentile
        self.bias = bias
        """calibrate(bias_correction=...): None leaves it to each partition's settings."""
        self.observers: dict[int, tuple[runtime.PartitionRuntime, RangeObserver]] = {}
        self.keys: dict[int, stored.Keys] = {}
        self.counts: dict[int, int] = {}
        self.sample = 0
        """The index of the sample running now (in a replay, of the earlier sample run again)."""
        self.first: dict[int, int] = {}
        """Per partition, the sample it first ran on: after 0, a recompile during calibration
        made it (a model whose first call changes its own state: LeViT's attention-bias cache)."""
        self.only: frozenset[int] | None = None
        """In a replay, the partitions that record; the others run without recording."""

    def observe(self, part: runtime.PartitionRuntime, args) -> tuple | None:
        """Record one call of `part`; its float outputs (on the inputs' device), or None where
        the partition must run itself."""
        if runtime._has_zero_size(args, part.entry.outputs):
            return None  # an empty partition runs eagerly; exporting it would divide by zero
        device = device_of(args)
        host = cpu_views(args)
        if id(part) not in self.observers:
            observer = part.range_observer(host, self.method, self.percentile)
            self.observers[id(part)] = (part, observer)
            self.keys[id(part)] = part.calibration_keys(host)
            self.first[id(part)] = self.sample
        record = self.only is None or id(part) in self.only
        outs = part.observe_inputs(self.observers[id(part)][1], host, record=record)
        if record:
            self.counts[id(part)] = self.counts.get(id(part), 0) + 1
        if outs is None or device is None:
            return outs
        return tuple(to_device(o, device) for o in outs)

    def corrects(self, part: runtime.PartitionRuntime) -> bool:
        """Whether this partition's biases are corrected (the argument, else its settings)."""
        if not part.settings.quantize:
            return False
        return part.settings.bias_correction if self.bias is None else self.bias


def _positional_count(compiled_model: Any) -> int | None:
    """How many positional inputs the model's forward takes (None: any number)."""
    module = getattr(compiled_model, "_orig_mod", compiled_model)
    try:
        params = inspect.signature(getattr(module, "forward", module)).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def _call(compiled_model: Any, sample: Any, positional: int | None) -> None:
    """One sample: a tensor, a tuple/list of inputs (a DataLoader's (inputs, labels) batch: the
    labels beyond forward()'s own arguments are dropped), or a dict of keyword inputs."""
    if isinstance(sample, dict):
        compiled_model(**sample)
        return
    args = tuple(sample) if isinstance(sample, (tuple, list)) else (sample,)
    if positional is not None and len(args) > positional:
        args = args[:positional]
    compiled_model(*args)


def samples_digest(samples: Any) -> str | None:
    """A digest of re-iterable tensor samples (list/tuple), or None (a generator, a DataLoader:
    reading it here would consume it)."""
    if not isinstance(samples, (list, tuple)) or not samples:
        return None
    from torch_fl.bpu.conversion.freezing import fingerprint

    parts: list[str] = []
    for sample in samples:
        items = sample if isinstance(sample, (tuple, list)) else (sample,)
        for item in items:
            if not isinstance(item, torch.Tensor):
                return None
            parts.append(f"{tuple(item.shape)}:{item.dtype}:{fingerprint(item):x}")
    return stored._key("samples", *parts)


def _replay(session: _Session, digest: str, method: str, percentile: float) -> bool:
    """With the same samples and settings calibrated before: every partition's stored record
    applied, and True (nothing to observe again)."""
    hits = {}
    for ident, (part, _) in session.observers.items():
        settings = part.settings
        cache_dir = settings.cache_dir if settings.cache else None
        bias = session.corrects(part)
        found = stored.STORE.get(
            _run_key(session.keys[ident], digest, method, percentile, bias), cache_dir
        )
        if found is None:
            return False
        hits[ident] = found[0]
    for ident, record in hits.items():
        part = session.observers[ident][0]
        part.set_scales(
            record.scales, f"{record.source}; the same samples again, from the store",
            dict(record.precision), dict(record.bias),
        )  # fmt: skip
    return bool(hits)


def _run_key(k: stored.Keys, digest: str, method: str, percentile: float, bias: bool) -> str:
    return stored._key("run", k.exact, digest, method, percentile, *(("bias",) if bias else ()))


def _target(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise CalibrationError(
            f"calibrate(target=...) is an output cosine in (0, 1], e.g. 0.999; got {value!r}"
        )
    return float(value)


def _say(summary: dict, label: str) -> None:
    moved = (
        f"{len(summary['int16'])} tensor(s) to int16, "
        f"{len(summary.get('dual_int16', ()))} to dual int16, {len(summary['float'])} to float"
    )
    verdict = "met" if summary["met"] else "NOT met (every allowed move made)"
    print(
        f"torch_fl.bpu.calibrate: {label}: output cosine {summary['cosine_int8']:.6f} in int8 -> "
        f"{summary['cosine']:.6f} with {moved}; target {summary['target']} {verdict}",
        flush=True,
    )
    paths = summary.get("layers", {})
    for step in summary["steps"]:
        # the layers reading each moved tensor, by module path (ONNX names where none reads it)
        named = ", ".join(dict.fromkeys(paths.get(t, t) for t in step["tensors"]))
        print(f"  {step['to']}: {named} -> cosine {step['cosine_after']:.6f}")
    for short in summary.get("int16_short", ()):
        print(f"  {short['message']}", flush=True)


def _run_samples(
    compiled_model: Any, samples: Iterable[Any], session: _Session, digest: str | None
) -> tuple[int, bool]:
    """Every sample through the model with `session` observing; (samples run, replayed): after
    the first, the same samples calibrated before are found in the store and the run stops."""
    positional = _positional_count(compiled_model)
    total = len(samples) if isinstance(samples, Sequence) else None
    token = runtime.CALIBRATION.set(session)
    count = 0
    try:
        with torch.no_grad(), Heartbeat("calibrate", total=total) as beat:
            for sample in samples:
                session.sample = count
                _call(compiled_model, sample, positional)
                count += 1
                beat.update(done=count)
                if (
                    count == 1
                    and digest is not None
                    and _replay(session, digest, session.method, session.percentile)
                ):
                    return count, True
            _run_missed(compiled_model, samples, session, positional)
    finally:
        runtime.CALIBRATION.reset(token)
    return count, False


REPLAY_ROUNDS = 2
"""How many times the samples a late partition missed are run again (a replay may recompile
once more)."""


def _run_missed(
    compiled_model: Any, samples: Iterable[Any], session: _Session, positional: int | None
) -> None:
    """The samples each partition missed, run again with only those partitions recording.

    A partition that first ran after sample 0 comes from a recompile during calibration: the
    model's first call changed its own state (a cache that Dynamo guards on), and the new graph's
    partitions saw only the later samples; with one sample, none. A list or tuple of samples is
    run again up to the last one they missed; other iterables (a generator, a DataLoader) cannot
    be, and a warning names the partitions and what they saw."""
    replayed: set[int] = set()
    for _ in range(REPLAY_ROUNDS):
        late = {i: f for i, f in session.first.items() if f > 0 and i not in replayed}
        if not late:
            return
        if not isinstance(samples, Sequence):
            _warn_late(session, late)
            return
        replayed.update(late)
        session.only = frozenset(late)
        try:
            for index in range(max(late.values())):
                session.sample = index
                _call(compiled_model, samples[index], positional)
        finally:
            session.only = None


def _warn_late(session: _Session, late: dict[int, int]) -> None:
    names = ", ".join(
        f"partition {session.observers[i][0].spec.index} (from sample {f + 1})"
        for i, f in sorted(late.items(), key=lambda kv: kv[1])
    )
    warnings.warn(
        f"calibrate: the model recompiled during calibration and {names} saw only the samples "
        "after it; pass the samples as a list (they are then run again for it), or call the "
        "model once before calibrate()",
        stacklevel=4,
    )


def _collect(
    result: Calibration,
    part: runtime.PartitionRuntime,
    scales: dict[str, float],
    names: Iterable[str],
    precision: dict[str, str],
    bias: dict[str, list[float]],
) -> None:
    """One partition's calibration into the returned `Calibration`."""
    result.scales[part.spec.fingerprint] = scales
    result.names[part.spec.fingerprint] = list(names)
    result.families[part.spec.family] = part.spec.fingerprint
    result.precision[part.spec.fingerprint] = precision
    if bias:
        result.bias[part.spec.fingerprint] = bias


def _int16_short(
    part: runtime.PartitionRuntime,
    observer: RangeObserver,
    scales: dict[str, float],
    precision: dict[str, str],
    summary: dict,
) -> list[dict]:
    """The layers int16 was not enough for (conversion/layer_check.py): each tensor the ladder
    moved to int16 (and perhaps on to float), its reader measured alone in int16."""
    from torch_fl.bpu.conversion.layer_check import int16_shortfalls

    promoted = [t for step in summary["steps"] if step["to"] == "int16" for t in step["tensors"]]
    return int16_shortfalls(
        observer, scales, part.settings.act_scale, promoted, precision, summary["target"],
        part.spec.gm,
    )  # fmt: skip


def _reader_paths(part: runtime.PartitionRuntime, observer: RangeObserver) -> dict[str, str]:
    """Activation tensor -> the module path(s) of the Conv / Gemm / MatMul reading it, else
    "<path> output" of the one writing it (what calibrate() prints instead of ONNX tensor
    names), "a, b" where several read it."""
    from torch_fl.bpu.conversion.layer_select import module_paths, weight_ops

    paths = module_paths(part.spec.gm, observer.model)
    readers: dict[str, list[str]] = {}
    writers: dict[str, str] = {}
    for node in weight_ops(observer.model):
        path = paths.get(node.name or node.output[0])
        if path:
            readers.setdefault(node.input[0], []).append(path)
            writers[node.output[0]] = f"{path} output"
    named = {t: ", ".join(dict.fromkeys(p)) for t, p in readers.items()}
    return {**writers, **named}


def _corrected_biases(
    part: runtime.PartitionRuntime,
    observer: RangeObserver,
    scales: dict[str, float],
    precision: dict[str, str],
    label: str,
) -> dict[str, list[float]]:
    """Bias correction of one partition (conversion/bias_correction.py), said in one line."""
    from torch_fl.bpu.conversion.bias_correction import corrections

    deltas, summary = corrections(observer, scales, part.settings.act_scale, precision)
    gain = ""
    if deltas:
        gain = (
            f" (the worst corrected layer alone {summary['cosine_before']:.6f} -> "
            f"{summary['cosine_after']:.6f})"
        )
    print(
        f"torch_fl.bpu.calibrate: {label}: bias correction in {summary['corrected']} of "
        f"{summary['layers']} layer(s) with a bias{gain}",
        flush=True,
    )
    return {name: [float(x) for x in delta] for name, delta in deltas.items()}


def _calibrate_partition(
    session: _Session,
    ident: int,
    target: float | None,
    digest: str | None,
    result: Calibration,
) -> None:
    """Scales from what one partition observed (moved to int16/float for `target`), made its
    own, stored, and collected into `result`."""
    part, observer = session.observers[ident]
    method, settings = session.method, part.settings
    scales = observer.scales()
    precision: dict[str, str] = {}
    short: list[dict] = []
    label = f"partition {part.spec.index}"
    if target is not None and settings.quantize:
        from torch_fl.bpu.conversion.precision import promote

        precision, summary = promote(observer, scales, settings.act_scale, target, settings.march)
        summary["partition"] = part.spec.index
        summary["layers"] = _reader_paths(part, observer)
        short = summary["int16_short"] = _int16_short(part, observer, scales, precision, summary)
        result.changes.append(summary)
        _say(summary, label)
    corrects = session.corrects(part)
    bias = _corrected_biases(part, observer, scales, precision, label) if corrects else {}
    seen = session.counts[ident]
    source = f"calibrate() on {seen} sample(s) ({method})"
    if precision:
        count = {
            level: sum(v == level for v in precision.values()) for level in set(precision.values())
        }
        source += f", target {target}: {count.get('int16', 0)} int16, "
        if count.get("dual_int16"):
            source += f"{count['dual_int16']} dual int16, "
        source += f"{count.get('float', 0)} float"
    if bias:
        source += f", bias corrected in {len(bias)} layer(s)"
    # stacklevel 3: a poor-health warning points at the user's calibrate() call
    record = part.record_calibration(
        observer, scales, session.keys[ident], source, seen, method, label,
        precision=precision, warn=target is None, stacklevel=3, bias=bias,
    )  # fmt: skip
    part.set_scales(scales, source, precision, bias)
    if short and part.entry.quant_health is not None:
        part.entry.quant_health["int16_short"] = short
    if digest is not None:
        run_key = _run_key(session.keys[ident], digest, method, session.percentile, corrects)
        stored.STORE.put_key(run_key, record, settings.cache_dir if settings.cache else None)
    _collect(result, part, scales, observer.names, precision, bias)


def calibrate(
    compiled_model: Any,
    samples: Iterable[Any],
    method: str = "max",
    percentile: float = 99.99,
    target: float | None = None,
    bias_correction: bool | None = None,
) -> Calibration:
    """Run `samples` through a model compiled with backend="bpu" and calibrate every partition.

    Each sample is a tensor, a tuple/list of positional inputs (a DataLoader's batches: labels
    past forward()'s arguments are dropped) or a dict of keyword inputs; `samples` may be any
    iterable (a list, a generator, a DataLoader). `method`: max, percentile, kl, mse or auto
    (conversion/thresholds.py). The scales go straight into the compiled model's partitions
    (they rebuild on the next call) and are returned as a `Calibration` that can be saved and
    passed as options={'calibration': ...} elsewhere. A list of the same samples calibrated again
    with the same settings is found in the store after its first sample: no second pass.

    `target` (an output cosine vs float, e.g. 0.999): measure each quantized tensor's
    sensitivity on the samples and move the most sensitive to int16, then float, until every
    partition's outputs reach it (conversion/precision.py); what moved, and what it bought, is
    printed and returned in `Calibration.changes`.

    `bias_correction` (None: each partition's option of that name, off by default): after the
    scales (and `target`'s moves), correct each Conv / Gemm bias by its output channels' mean
    quantization error on the samples, per layer only where that raises the layer's own output
    cosine (conversion/bias_correction.py); the corrections are saved with the calibration.
    """
    # the same checks (and one-line errors) as options={'calib_method': ..., ...}
    method = parse_option("calib_method", method, "calibrate(method=...)")
    percentile = parse_option("calib_percentile", percentile, "calibrate(percentile=...)")
    target = _target(target)
    if bias_correction is not None:
        bias_correction = parse_option(
            "bias_correction", bias_correction, "calibrate(bias_correction=...)"
        )
    session = _Session(method, percentile, bias_correction)
    digest = samples_digest(samples)
    if digest is not None and target is not None:
        digest = stored._key(digest, "target", target)
    count, replayed = _run_samples(compiled_model, samples, session, digest)
    if count == 0:
        raise CalibrationError(
            "calibrate: no samples given; pass an iterable of input tensors/tuples"
        )
    if not session.observers:
        raise CalibrationRunError(
            "calibrate: no BPU partition ran. Pass the object returned by "
            "torch.compile(model, backend='bpu') (not the original model)"
        )
    result = Calibration(method=method)
    for ident, (part, observer) in session.observers.items():
        if replayed:
            scales = dict(part.scales or {})
            _collect(result, part, scales, observer.names, dict(part.precision), dict(part.bias))
        else:
            _calibrate_partition(session, ident, target, digest, result)
    return result

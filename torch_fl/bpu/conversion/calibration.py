"""Activation calibration: observe real inputs, turn ranges into per-tensor int8 scales.

Scales are keyed by partition fingerprint (a hash of the partition's graph, shapes and frozen
mask, stable across processes) and then by ONNX tensor name, so a `Calibration` saved in one
process applies to the same model compiled in another, and every partition of a model gets its
own scales (the earlier backend named all partition inputs alike and could not do this).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from torch_fl import atomic
from torch_fl.bpu.conversion.qdq import QMAX, activation_inputs
from torch_fl.bpu.conversion.thresholds import Reservoir, threshold
from torch_fl.bpu.errors import CalibrationError

FORMAT_VERSION = 1
HEALTH_SAMPLES = 16  # calibration samples kept per partition to measure int8 against float
HEALTH_BYTES = 256 << 20  # ... and at most this many bytes of them (big batches keep fewer)
HEALTH_RUN_BYTES = 256 << 20  # the float runs of kept samples held for the health check, at most
HEALTH_COSINE = 0.99  # below this output cosine vs float, calibration warns
RESERVOIR = 1 << 18  # |x| values kept per tensor for the percentile / kl / mse / auto methods


class Calibration:
    """Per-partition activation scales: {fingerprint: {tensor_name: scale}}.

    `families` maps a partition's shape-free structure digest to a fingerprint, and `names`
    keeps each fingerprint's quantized tensors in graph order, so a saved calibration also
    applies to the same graph at another batch size (`for_family`; the runtime maps the scales
    onto the new partition's tensors by position).
    """

    def __init__(
        self,
        scales: Mapping[str, Mapping[str, float]] | None = None,
        method: str = "max",
        families: Mapping[str, str] | None = None,
        names: Mapping[str, Sequence[str]] | None = None,
        precision: Mapping[str, Mapping[str, str]] | None = None,
        bias: Mapping[str, Mapping[str, Sequence[float]]] | None = None,
    ) -> None:
        self.scales: dict[str, dict[str, float]] = {
            k: {n: float(s) for n, s in v.items()} for k, v in (scales or {}).items()
        }
        self.method = method
        self.names: dict[str, list[str]] = {
            str(k): [str(n) for n in v] for k, v in (names or {}).items() if k in self.scales
        }
        self.families: dict[str, str] = {
            str(k): str(v) for k, v in (families or {}).items() if v in self.names
        }
        self.precision: dict[str, dict[str, str]] = {
            str(k): {str(n): str(p) for n, p in v.items()}
            for k, v in (precision or {}).items()
            if k in self.scales
        }
        """Per fingerprint, the tensors kept in int16 or float (calibrate(target=...))."""
        self.bias: dict[str, dict[str, list[float]]] = {
            str(k): {str(n): [float(x) for x in d] for n, d in v.items()}
            for k, v in (bias or {}).items()
            if k in self.scales and v
        }
        """Per fingerprint, bias tensor -> correction per channel (calibrate(bias_correction=))."""
        self.changes: list[dict] = []
        """What calibrate(target=...) moved out of int8 per partition, and what it bought."""

    def for_partition(self, fingerprint: str) -> dict[str, float] | None:
        return self.scales.get(fingerprint)

    def precision_for(self, fingerprint: str) -> dict[str, str]:
        return dict(self.precision.get(fingerprint, {}))

    def bias_for(self, fingerprint: str) -> dict[str, list[float]]:
        return dict(self.bias.get(fingerprint, {}))

    def for_family(self, family: str) -> tuple[dict[str, float], list[str]] | None:
        """(scales, tensor names in graph order) of a partition with this structure, if any."""
        fingerprint = self.families.get(family)
        if fingerprint is None:
            return None
        return self.scales[fingerprint], self.names[fingerprint]

    def __len__(self) -> int:
        return len(self.scales)

    def __repr__(self) -> str:
        n = sum(len(v) for v in self.scales.values())
        return f"Calibration({len(self.scales)} partitions, {n} tensors, method={self.method!r})"

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT_VERSION,
                "method": self.method,
                "scales": self.scales,
                "families": self.families,
                "names": self.names,
                "precision": self.precision,
                "bias": self.bias,
            },
            indent=1,
            sort_keys=True,
        )

    def save(self, path: str | os.PathLike) -> None:
        """Atomic write: a reader never sees half a file."""
        atomic.write_text(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike) -> Calibration:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CalibrationError(
                f"calibration file {path} does not exist; create it with "
                "torch_fl.bpu.calibrate(model, samples).save(path)"
            ) from None
        if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION:
            raise CalibrationError(
                f"{path} is not a torch_fl.bpu calibration file (format {FORMAT_VERSION}); "
                "recreate it with torch_fl.bpu.calibrate(...).save(path)"
            )
        return cls(
            data["scales"],
            data.get("method", "max"),
            data.get("families"),
            data.get("names"),
            data.get("precision"),
            data.get("bias"),
        )


class RangeObserver:
    """Collects |x| statistics per activation tensor of one float ONNX partition."""

    def __init__(self, model: onnx.ModelProto, method: str, percentile: float) -> None:
        import onnxruntime as ort

        self.method = method
        self.percentile = percentile
        self.names = activation_inputs(model)
        graph_outputs = {o.name for o in model.graph.output}
        probe = onnx.ModelProto()
        probe.CopyFrom(model)
        existing = {vi.name: vi for vi in model.graph.value_info}
        existing.update({vi.name: vi for vi in model.graph.input})
        for name in self.names:
            if name in graph_outputs:
                continue
            if name in existing:
                probe.graph.output.append(existing[name])
            else:
                probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
        options = ort.SessionOptions()
        options.log_severity_level = 3
        self.session = ort.InferenceSession(
            probe.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in model.graph.output]
        self.fetch = list(dict.fromkeys(self.output_names + list(self.names)))
        """What one run of `session` returns: the graph's outputs, then every activation."""
        # max: the exact maximum alone; the other methods a bounded sample of |x| per tensor
        self.values: dict[str, Reservoir] = {
            n: Reservoir(capacity=1 if method == "max" else RESERVOIR) for n in self.names
        }
        self.observed = False
        self.chosen: dict[str, str] = {}
        """Per tensor, the method that set its scale (`auto` picks per tensor)."""
        self.model = model
        # partition inputs of up to HEALTH_SAMPLES samples, a uniform choice over the whole
        # stream (reservoir sampling: the target ladder, health, bias correction and the layer
        # report judge every part of it, not its first samples), kept to measure the int8 graph
        # against the float one once the scales are known
        self.kept_inputs: list[list[np.ndarray]] = []
        # the float run of each kept sample (its outputs and activations), while they fit in
        # HEALTH_RUN_BYTES: the health check reads them instead of running the float graph on
        # the sample again (None: not held, run again). ResNet-18's calibrate() on 32 samples
        # ran the float graph 48 times before (32 observed, 16 again for the health check).
        self.kept_runs: list[dict[str, np.ndarray] | None] = []
        self._run_bytes = 0
        self.seen = 0
        self._pick = np.random.default_rng(0)  # deterministic: the same samples, the same choice

    def _keep(self, inputs: Sequence[np.ndarray]) -> int | None:
        """Keep `inputs` (reservoir sampling); the slot they went to, or None."""
        size = sum(int(np.asarray(a).nbytes) for a in inputs)
        capacity = max(1, min(HEALTH_SAMPLES, HEALTH_BYTES // max(size, 1)))
        self.seen += 1
        if len(self.kept_inputs) < capacity:
            self.kept_inputs.append([np.array(a, copy=True) for a in inputs])
            self.kept_runs.append(None)
            return len(self.kept_inputs) - 1
        slot = int(self._pick.integers(0, self.seen))
        if slot < capacity:
            self.kept_inputs[slot] = [np.array(a, copy=True) for a in inputs]
            self._hold_run(slot, None)
            return slot
        return None

    def _hold_run(self, slot: int, fetched: dict[str, np.ndarray] | None) -> None:
        old = self.kept_runs[slot]
        if old is not None:
            self._run_bytes -= sum(int(v.nbytes) for v in old.values())
        self.kept_runs[slot] = None
        if fetched is None:
            return
        size = sum(int(np.asarray(v).nbytes) for v in fetched.values())
        if self._run_bytes + size > HEALTH_RUN_BYTES:
            return
        # the outputs are handed on to the model, which may write to them: a copy is held
        held = {
            k: np.array(v, copy=True) if k in self.output_names else v for k, v in fetched.items()
        }
        self.kept_runs[slot] = held
        self._run_bytes += size

    def kept_run(self, index: int) -> dict[str, np.ndarray]:
        """The float run (outputs and every activation) of kept sample `index`: held from its
        observation, or run again."""
        held = self.kept_runs[index] if index < len(self.kept_runs) else None
        if held is not None:
            return held
        return self.run(dict(zip(self.input_names, self.kept_inputs[index], strict=False)))

    def observe(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Record one sample's activations; returns the float graph's outputs for it (the same
        run computed them: calibration hands them on instead of running the partition again)."""
        slot = self._keep(inputs)
        feed = dict(zip(self.input_names, inputs, strict=False))
        fetched = self.run(feed)
        for name in self.names:
            self.values[name].add(fetched[name])
        if slot is not None:
            self._hold_run(slot, fetched)
        self.observed = True
        return [fetched[name] for name in self.output_names]

    def outputs(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The float graph's outputs for one sample, nothing recorded."""
        fetched = self.session.run(
            self.output_names, dict(zip(self.input_names, inputs, strict=False))
        )
        return list(fetched)

    def run(self, feed: dict) -> dict[str, np.ndarray]:
        """The float graph's outputs and activations for `feed`, by name, from one run."""
        return dict(zip(self.fetch, self.session.run(self.fetch, feed), strict=True))

    def scales(self) -> dict[str, float]:
        out = {}
        if not self.observed:
            return out
        for name in self.names:
            bound, chosen = threshold(self.values[name], self.method, self.percentile)
            self.chosen[name] = chosen
            # An all-zero tensor still needs a valid (positive) scale.
            out[name] = bound / QMAX if bound > 0 else 1.0 / QMAX
        return out


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    na, nb = float(np.linalg.norm(a64)), float(np.linalg.norm(b64))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return float(a64 @ b64 / (na * nb))


def _session(model: onnx.ModelProto):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    # the same exact rounding the sim executor's reference path uses
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])


def _health_stats(
    observer: RangeObserver,
    scales: Mapping[str, float],
    default_scale: float,
    precision: Mapping[str, str] | None,
    bias: Mapping[str, Sequence[float]] | None = None,
) -> tuple[float, dict[str, list[float]]]:
    """The worst output cosine (int8 vs float) over the kept samples, and per quantized tensor
    [values, saturated, nonzero, zeroed] counts."""
    from torch_fl.bpu.conversion.qdq import add_to_biases, quantize_model

    base = add_to_biases(observer.model, bias) if bias else observer.model
    quantized = quantize_model(base, scales, default_scale, precision)
    int8_session = _session(quantized)
    out_names = observer.output_names
    worst_cos = 1.0
    per_tensor: dict[str, list[float]] = {n: [0.0, 0.0, 0.0, 0.0] for n in observer.names}
    for index, inputs in enumerate(observer.kept_inputs):
        feed = dict(zip(observer.input_names, inputs, strict=False))
        fetched = observer.kept_run(index)  # the outputs and every activation, one float run
        got = int8_session.run(out_names, feed)
        for name, b in zip(out_names, got, strict=True):
            worst_cos = min(worst_cos, _cosine(np.asarray(fetched[name]), np.asarray(b)))
        values = [fetched[n] for n in observer.names]
        for name, value in zip(observer.names, values, strict=True):
            scale = float(scales.get(name, default_scale))
            ratio = np.abs(np.asarray(value, dtype=np.float32)) / scale
            stats = per_tensor[name]
            stats[0] += ratio.size
            stats[1] += int(np.count_nonzero(ratio > QMAX + 0.5))
            nonzero = ratio > 0
            stats[2] += int(np.count_nonzero(nonzero))
            stats[3] += int(np.count_nonzero(nonzero & (ratio < 0.5)))
    return worst_cos, per_tensor


def _health_summary(
    worst_cos: float,
    per_tensor: dict[str, list[float]],
    scales: Mapping[str, float],
    default_scale: float,
    samples: int,
) -> dict:
    """`health`'s result from `_health_stats`: totals, and the worst tensor's own numbers."""
    total = sum(v[0] for v in per_tensor.values()) or 1.0
    saturated = sum(v[1] for v in per_tensor.values())
    nonzero = sum(v[2] for v in per_tensor.values()) or 1.0
    zeroed = sum(v[3] for v in per_tensor.values())

    def badness(item) -> float:
        _, (count, sat, nz, zero) = item
        return sat / max(count, 1.0) + zero / max(nz, 1.0)

    worst = max(per_tensor.items(), key=badness, default=None)
    result = {
        "cosine": round(worst_cos, 6),
        "saturated_pct": round(100.0 * saturated / total, 4),
        "zeroed_pct": round(100.0 * zeroed / nonzero, 4),
        "samples": samples,
    }
    if worst is not None:
        name, (count, sat, nz, zero) = worst
        result["worst_tensor"] = {
            "name": name,
            "scale": float(scales.get(name, default_scale)),
            "saturated_pct": round(100.0 * sat / max(count, 1.0), 4),
            "zeroed_pct": round(100.0 * zero / max(nz, 1.0), 4),
        }
    return result


def health(
    observer: RangeObserver,
    scales: Mapping[str, float],
    default_scale: float,
    label: str = "partition",
    warn: bool = True,
    precision: Mapping[str, str] | None = None,
    stacklevel: int = 3,
    bias: Mapping[str, Sequence[float]] | None = None,
) -> dict:
    """How far the int8 partition is from the float one on the kept calibration samples.

    Returns {"cosine": worst output cosine over the samples, "saturated_pct" / "zeroed_pct": share
    of quantized activation values clipped at +-127 / non-zero values rounded to 0, and
    "worst_tensor" with its own numbers}. Warns (once per call) when the cosine is below
    HEALTH_COSINE, naming the partition and the worst tensor: a collapsed int8 graph must be
    visible before it is deployed. `stacklevel` is the warning's, as warnings.warn counts it
    from here (3: the caller's caller).
    """
    if not observer.kept_inputs:
        return {}
    worst_cos, per_tensor = _health_stats(observer, scales, default_scale, precision, bias)
    result = _health_summary(
        worst_cos, per_tensor, scales, default_scale, len(observer.kept_inputs)
    )
    if warn and worst_cos < HEALTH_COSINE:
        detail = result.get("worst_tensor", {})
        warnings.warn(
            f"torch_fl.bpu: {label}: int8 quantization health is poor: output cosine "
            f"{worst_cos:.4f} vs float (< {HEALTH_COSINE}) on {result['samples']} calibration "
            f"sample(s); worst tensor {detail.get('name', '?')!r} (scale "
            f"{detail.get('scale', float('nan')):.3g}, {detail.get('saturated_pct', 0)}% "
            f"saturated, {detail.get('zeroed_pct', 0)}% rounded to zero). Fix: calibrate on "
            "representative inputs (more samples, method='percentile'), or keep this partition "
            "in float with options={'quantize': False}",
            stacklevel=stacklevel,
        )
    return result


def merge(calibrations: Iterable[Calibration]) -> Calibration:
    merged = Calibration()
    for cal in calibrations:
        merged.scales.update(cal.scales)
        merged.names.update(cal.names)
        merged.families.update(cal.families)
        merged.precision.update(cal.precision)
        merged.bias.update(cal.bias)
        merged.method = cal.method
    return merged

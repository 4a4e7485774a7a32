"""Activation calibration: observe real inputs, turn ranges into per-tensor int8 scales.

Scales are keyed by partition fingerprint (a hash of the partition's graph, shapes and frozen
mask, stable across processes) and then by ONNX tensor name, so a `Calibration` saved in one
process applies to the same model compiled in another, and every partition of a model gets its
own scales (the earlier backend named all partition inputs alike and could not do this).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from torch_fl.bpu.conversion.qdq import QMAX, activation_inputs

FORMAT_VERSION = 1


class Calibration:
    """Per-partition activation scales: {fingerprint: {tensor_name: scale}}."""

    def __init__(
        self, scales: Mapping[str, Mapping[str, float]] | None = None, method: str = "max"
    ) -> None:
        self.scales: dict[str, dict[str, float]] = {
            k: {n: float(s) for n, s in v.items()} for k, v in (scales or {}).items()
        }
        self.method = method

    def for_partition(self, fingerprint: str) -> dict[str, float] | None:
        return self.scales.get(fingerprint)

    def __len__(self) -> int:
        return len(self.scales)

    def __repr__(self) -> str:
        n = sum(len(v) for v in self.scales.values())
        return f"Calibration({len(self.scales)} partitions, {n} tensors, method={self.method!r})"

    def to_json(self) -> str:
        return json.dumps(
            {"format": FORMAT_VERSION, "method": self.method, "scales": self.scales},
            indent=1,
            sort_keys=True,
        )

    def save(self, path: str | os.PathLike) -> None:
        """Atomic write: a reader never sees half a file."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(self.to_json())
        os.replace(tmp, target)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Calibration:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ValueError(
                f"calibration file {path} does not exist; create it with "
                "torch_fl.bpu.calibrate(model, samples).save(path)"
            ) from None
        if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION:
            raise ValueError(
                f"{path} is not a torch_fl.bpu calibration file (format {FORMAT_VERSION}); "
                "recreate it with torch_fl.bpu.calibrate(...).save(path)"
            )
        return cls(data["scales"], data.get("method", "max"))


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
        self.maxima: dict[str, float] = {}
        self.samples: dict[str, list[np.ndarray]] = {n: [] for n in self.names}

    def observe(self, inputs: Sequence[np.ndarray]) -> None:
        feed = dict(zip(self.input_names, inputs, strict=False))
        values = self.session.run(self.names, feed) if self.names else []
        for name, value in zip(self.names, values, strict=False):
            absval = np.abs(np.asarray(value, dtype=np.float32))
            self.maxima[name] = max(self.maxima.get(name, 0.0), float(absval.max(initial=0.0)))
            if self.method == "percentile":
                self.samples[name].append(absval.ravel())

    def scales(self) -> dict[str, float]:
        out = {}
        for name in self.names:
            if name not in self.maxima:
                continue
            if self.method == "percentile" and self.samples[name]:
                bound = float(np.percentile(np.concatenate(self.samples[name]), self.percentile))
            else:
                bound = self.maxima[name]
            # An all-zero tensor still needs a valid (positive) scale.
            out[name] = bound / QMAX if bound > 0 else 1.0 / QMAX
        return out


def merge(calibrations: Iterable[Calibration]) -> Calibration:
    merged = Calibration()
    for cal in calibrations:
        merged.scales.update(cal.scales)
        merged.method = cal.method
    return merged

"""Where a partition's calibration lives between compilations: this process, and the cache.

Calibration belongs to the model, not to one Dynamo graph. A `torch._dynamo.reset()`, a guard
failure (grad mode, a new batch size) or a new process compiles the same partition again; it
must find the scales `calibrate()` measured instead of running int8 with the default scale.

A record is keyed by what determines it:
- `exact_key`: the partition fingerprint (graph code, input shapes and dtypes, frozen mask) and
  an XXH3-128 digest of every frozen weight (not the method: the latest calibration of these
  weights wins, whichever method made it);
- `family_key`: the graph's structure instead of its fingerprint (ops and wiring, integer
  literals and placeholder names left out, input ranks kept), so the scales of one shape carry
  over to another shape of the same graph (a new batch size). A record keeps its activation
  tensors in graph order, and carried-over scales are mapped onto the new partition's tensors by
  position (`carry`); where the two do not line up, the partition counts as uncalibrated.

Records live in memory for the process and, when the cache is on, as small JSON files under
`<cache_dir>/calibration/` written atomically, so a restart finds them too. A corrupt file is a
miss with one warning, never an error.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from torch_fl import atomic
from torch_fl.targets import PRECISIONS

FORMAT_VERSION = 1
FIRST_CALL = "first call"
"""How the source of scales measured on one call begins (a guess, redone when weights change)."""


@dataclass(frozen=True)
class Record:
    """One partition's scales and where they came from."""

    scales: dict[str, float]
    names: tuple[str, ...]
    """The partition's quantized activation tensors in graph order (for `carry`)."""
    source: str
    """e.g. "calibrate() on 32 samples (max)", "first call (1 sample)"."""
    samples: int
    method: str
    precision: dict[str, str] = field(default_factory=dict)
    """Tensors kept in int16 or float (calibrate(target=...), options int16/float); int8 else."""
    bias: dict[str, list[float]] = field(default_factory=dict)
    """Bias correction (calibrate(bias_correction=True)): bias tensor -> delta per channel."""

    @property
    def guessed(self) -> bool:
        return self.source.startswith(FIRST_CALL)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT_VERSION,
                "scales": self.scales,
                "names": list(self.names),
                "source": self.source,
                "samples": self.samples,
                "method": self.method,
                "precision": self.precision,
                "bias": self.bias,
                "written": time.time(),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Record:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION:
            raise ValueError("not a calibration record")
        scales = data["scales"]
        if not isinstance(scales, dict) or not scales:
            raise ValueError("no scales")
        clean = {}
        for name, value in scales.items():
            number = float(value)
            if not (isinstance(name, str) and number > 0 and number < float("inf")):
                raise ValueError(f"bad scale for {name!r}")
            clean[name] = number
        names = tuple(str(n) for n in data["names"])
        precision = data.get("precision") or {}
        if not isinstance(precision, dict) or any(v not in PRECISIONS for v in precision.values()):
            raise ValueError("bad precision")
        return cls(
            clean, names, str(data["source"]), int(data["samples"]), str(data["method"]),
            {str(k): str(v) for k, v in precision.items()}, bias_deltas(data.get("bias")),
        )  # fmt: skip


def bias_deltas(value: Any) -> dict[str, list[float]]:
    """A stored bias-correction map checked: tensor name -> finite numbers (ValueError else)."""
    if not value:
        return {}
    if not isinstance(value, dict):
        raise ValueError("bad bias correction")
    out = {}
    for name, delta in value.items():
        numbers = [float(x) for x in delta]
        if not all(math.isfinite(x) for x in numbers):
            raise ValueError(f"bad bias correction for {name!r}")
        out[str(name)] = numbers
    return out


def family_of(gm: torch.fx.GraphModule) -> str:
    """A digest of the partition graph's structure that ignores shapes: ops and their wiring,
    with integer literals and placeholder names left out and input ranks kept."""
    index: dict[torch.fx.Node, int] = {}

    def canon(value: Any) -> Any:
        if isinstance(value, torch.fx.Node):
            return ("node", index[value])
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, (list, tuple)):
                return [canon(v) for v in value]
            if isinstance(value, dict):
                return sorted((str(k), canon(v)) for k, v in value.items())
            return repr(value)
        return "#"

    parts = []
    for i, node in enumerate(gm.graph.nodes):
        index[node] = i
        if node.op == "placeholder":
            val = node.meta.get("val")
            rank = val.dim() if isinstance(val, torch.Tensor) else None
            parts.append(("input", rank, str(getattr(val, "dtype", None))))
        else:
            parts.append((node.op, str(node.target), canon(node.args), canon(node.kwargs)))
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:20]


def weights_digest(weights: Iterable[torch.Tensor]) -> str:
    """XXH3-128 over every frozen weight's shape, dtype and bytes (host views of them)."""
    from torch_fl.bpu.conversion.freezing import fingerprint

    h = hashlib.sha256()
    for tensor in weights:
        h.update(repr((tuple(tensor.shape), str(tensor.dtype))).encode())
        h.update(fingerprint(tensor).to_bytes(16, "little"))
    return h.hexdigest()[:32]


def _key(*parts: object) -> str:
    return hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()


@dataclass(frozen=True)
class Keys:
    exact: str
    family: str


def keys(fingerprint: str, family: str, weights: str) -> Keys:
    return Keys(_key("exact", fingerprint, weights), _key("family", family, weights))


def carry_precision(
    precision: Mapping[str, str], old_names: Sequence[str], new_names: Sequence[str]
) -> dict[str, str]:
    """`precision` of one partition mapped by position onto a partition of the same family."""
    if len(old_names) != len(new_names):
        return {}
    return {
        new: precision[old]
        for old, new in zip(old_names, new_names, strict=True)
        if old in precision
    }


def carry(
    scales: Mapping[str, float], old_names: Sequence[str], new_names: Sequence[str]
) -> dict[str, float] | None:
    """`scales` measured on a partition with activation tensors `old_names`, mapped by position
    onto a partition of the same family with tensors `new_names`; None if they do not line up."""
    if len(old_names) != len(new_names) or not all(n in scales for n in old_names):
        return None
    return {new: float(scales[old]) for old, new in zip(old_names, new_names, strict=True)}


class CalibrationStore:
    """The process's calibration records, backed by `<cache_dir>/calibration/` when given."""

    def __init__(self) -> None:
        self._memory: dict[str, Record] = {}
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def first_warning(self, key: str) -> bool:
        """True the first time `key` asks in this process (a warning given once)."""
        with self._lock:
            if key in self._warned:
                return False
            self._warned.add(key)
            return True

    def put(self, k: Keys, record: Record, cache_dir: str | None) -> None:
        self._put((k.exact, k.family), record, cache_dir)

    def put_key(self, key: str, record: Record, cache_dir: str | None) -> None:
        """`record` under one more key (calibrate()'s key of the very samples it saw)."""
        self._put((key,), record, cache_dir)

    def _put(self, names: tuple[str, ...], record: Record, cache_dir: str | None) -> None:
        with self._lock:
            for key in names:
                self._memory[key] = record
        if cache_dir is None:
            return
        try:
            for key in names:
                atomic.write_text(_path(cache_dir, key), record.to_json())
        except OSError as exc:
            warnings.warn(
                f"torch_fl.bpu: could not save calibration under {cache_dir}/calibration "
                f"({exc.strerror or exc}); it lasts for this process only",
                RuntimeWarning,
                stacklevel=4,
            )

    def get(self, key: str, cache_dir: str | None) -> tuple[Record, str] | None:
        """(record, "memory" | "cache") for `key`, or None."""
        with self._lock:
            found = self._memory.get(key)
        if found is not None:
            return found, "memory"
        if cache_dir is None:
            return None
        record = _read(_path(cache_dir, key))
        if record is None:
            return None
        with self._lock:
            self._memory.setdefault(key, record)
        return record, "cache"

    def clear_memory(self) -> None:
        """Forget this process's records (tests use it to stand for a new process)."""
        with self._lock:
            self._memory.clear()
            self._warned.clear()


def _path(cache_dir: str, key: str) -> Path:
    return Path(cache_dir) / "calibration" / f"{key}.json"


def _read(path: Path) -> Record | None:
    from torch_fl.bpu.cache import read_regular

    try:
        return Record.from_json(read_regular(path).decode("utf-8"))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        warnings.warn(
            f"torch_fl.bpu: calibration record {path} is unreadable ({type(exc).__name__}: "
            f"{exc}); ignored (delete it, or recalibrate to overwrite it)",
            RuntimeWarning,
            stacklevel=4,
        )
        return None


STORE = CalibrationStore()

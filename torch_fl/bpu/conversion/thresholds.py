"""Where to clip a tensor for symmetric int8: the calibration methods, from observed |x| values.

Each method returns the threshold t (scale = t / 127) for one activation tensor:

- `max`: the largest |x| seen. Nothing saturates; with heavy tails the bulk loses resolution.
- `percentile`: the given percentile of |x| (outliers beyond it saturate).
- `kl`: TensorRT's entropy calibration: the t whose 128-level quantized histogram of |x| is
  closest (Kullback-Leibler) to the 2048-bin original, tails folded into the last bin.
- `mse`: the t that minimises the mean squared quantization error (rounding inside, clipping
  outside) over the observed values, searched on a grid from max/8 to max.
- `auto`: of the four, per tensor, the one with the least mean squared error on the same values:
  the error the tensor itself causes, measured, not assumed.

The values come from `Reservoir`: a bounded uniform sample of every |x| observed (so a long
calibration keeps constant memory), and the exact maximum.
"""

from __future__ import annotations

import numpy as np

QMAX = 127
BINS = 2048
LEVELS = 128  # |x| in symmetric int8: 0..127
METHODS = ("max", "percentile", "kl", "mse", "auto")


class Reservoir:
    """A uniform sample (at most `capacity` values) of the |x| of every observed array, and the
    exact max. Deterministic: seeded once."""

    def __init__(self, capacity: int = 1 << 18, seed: int = 0) -> None:
        self.capacity = capacity
        self.values = np.empty(0, np.float32)
        self.seen = 0
        self.maximum = 0.0
        self._rng = np.random.default_rng(seed)

    def add(self, array: np.ndarray) -> None:
        flat = np.abs(np.asarray(array, dtype=np.float32)).ravel()
        if flat.size == 0:
            return
        flat = flat[np.isfinite(flat)]
        if flat.size == 0:
            return
        self.maximum = max(self.maximum, float(flat.max()))
        total = self.seen + flat.size
        # each value of the stream is kept with probability capacity / total
        keep_new = min(flat.size, max(1, round(self.capacity * flat.size / total)))
        if keep_new < flat.size:
            flat = self._rng.choice(flat, keep_new, replace=False)
        if self.values.size + flat.size > self.capacity:
            keep_old = self.capacity - flat.size
            self.values = self._rng.choice(self.values, max(keep_old, 0), replace=False)
        self.values = np.concatenate([self.values, flat])
        self.seen = total


def _histogram(values: np.ndarray, top: float) -> tuple[np.ndarray, float]:
    hist, _ = np.histogram(values, bins=BINS, range=(0.0, top))
    return hist.astype(np.float64), top / BINS


def quant_mse(values: np.ndarray, threshold: float) -> float:
    """Mean squared error of symmetric int8 quantization with clip at `threshold`."""
    if threshold <= 0 or values.size == 0:
        return float(np.mean(values.astype(np.float64) ** 2)) if values.size else 0.0
    scale = threshold / QMAX
    q = np.clip(np.rint(values / scale), 0, QMAX) * scale
    return float(np.mean((values.astype(np.float64) - q) ** 2))


def _mse_threshold(values: np.ndarray, top: float) -> float:
    hist, width = _histogram(values, top)
    centers = (np.arange(BINS) + 0.5) * width
    best, best_err = top, np.inf
    for t in np.linspace(top / 8, top, 120):
        scale = t / QMAX
        q = np.clip(np.rint(centers / scale), 0, QMAX) * scale
        err = float(hist @ (centers - q) ** 2)
        if err < best_err:
            best, best_err = float(t), err
    return best


def _kl_threshold(values: np.ndarray, top: float) -> float:
    # exact zeros (half of a Relu's output) quantize exactly at any scale; left in, their spike
    # in bin 0 dominates the divergence and pulls the threshold far too low
    hist, width = _histogram(values[values > 0], top)
    best_i, best_kl = BINS, np.inf
    for i in range(LEVELS, BINS + 1, 16):
        p = hist[:i].copy()
        p[-1] += hist[i:].sum()  # what is clipped lands in the last level
        if p.sum() == 0:
            continue
        # quantize the first i bins into LEVELS levels, then spread each level back over the
        # bins it covers that were non-empty
        edges = np.linspace(0, i, LEVELS + 1).astype(int)
        q = np.zeros(i)
        for lo, hi in zip(edges[:-1], edges[1:], strict=True):
            chunk = hist[lo:hi]
            nonzero = chunk > 0
            if nonzero.any():
                q[lo:hi][nonzero] = chunk.sum() / nonzero.sum()
        mask = p > 0
        pn, qn = p / p.sum(), q / max(q.sum(), 1e-30)
        if np.any(qn[mask] == 0):
            kl = np.inf
        else:
            kl = float(np.sum(pn[mask] * np.log(pn[mask] / qn[mask])))
        if kl < best_kl:
            best_i, best_kl = i, kl
    return (best_i + 0.5) * width if best_i < BINS else top


def threshold(reservoir: Reservoir, method: str, percentile: float = 99.99) -> tuple[float, str]:
    """The clip threshold for `method`, and the method that chose it (`auto` names its pick)."""
    top = reservoir.maximum
    values = reservoir.values
    if top <= 0 or values.size == 0 or method == "max":
        return top, "max"
    if method == "percentile":
        return float(np.percentile(values, percentile)), "percentile"
    if method == "kl":
        return _kl_threshold(values, top), "kl"
    if method == "mse":
        return _mse_threshold(values, top), "mse"
    if method != "auto":
        raise ValueError(f"calibration method must be one of {METHODS}, not {method!r}")
    candidates = {
        "max": top,
        "percentile": float(np.percentile(values, percentile)),
        "kl": _kl_threshold(values, top),
        "mse": _mse_threshold(values, top),
    }
    pick = min(candidates, key=lambda k: quant_mse(values, candidates[k]))
    return candidates[pick], pick

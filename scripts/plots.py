"""What the benchmarks' figures share: a headless pyplot, side-by-side bars, an atomic save.

matplotlib is optional (requirements.txt has it, a trimmed environment may not): `pyplot()` is
None without it and each benchmark then writes its JSON and table only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def pyplot() -> Any | None:
    """matplotlib.pyplot on the Agg backend (no display needed), or None when not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def grouped_bars(
    ax: Any, labels: Sequence[str], series: Mapping[str, Sequence[float]], **ticks: Any
) -> None:
    """One group of bars per label, one bar per series in it, side by side; the legend names
    the series. `ticks` go to set_xticks (rotation, fontsize...)."""
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        offset = (i - len(series) / 2 + 0.5) * width
        ax.bar([j + offset for j in range(len(labels))], list(values), width, label=name)
    ax.set_xticks(range(len(labels)), list(labels), **ticks)


def save(plt: Any, fig: Any, path: Path, dpi: int = 110) -> None:
    """Write the figure to `path` whole (a temp name, then a rename) and free it."""
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=dpi)
    os.replace(tmp, path)
    plt.close(fig)

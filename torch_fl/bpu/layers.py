"""The per-layer view: `layer_report(compiled, samples)`, keyed by module path.

For every quantized weight op (Conv, Gemm, MatMul with a constant weight) of every partition,
in network order: the module it came from (`features.3.conv.1`, from the FX graph's
nn_module_stack, matched to the ONNX op of the same kind and rank), the op, the precision of its
input (int8 / int16 / float), its input's scale and the share of values that saturate or round
to zero on the samples, and two cosines against float on the same samples:

- `cosine_alone`: this layer quantized and everything else float (what the layer itself costs);
- `cosine_accumulated`: this layer's output in the fully quantized partition (what reaches it).

A layer whose alone-cosine is low needs int16 (or float); one whose accumulated cosine drops
where its alone-cosine is fine suffers from the layers before it. `table()`, `to_json()` and
`plot(path)` (cosine per layer, in network order) show it; the worst layers also appear in
`explain()`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torch_fl import atomic
from torch_fl.bpu.conversion.calibration import QMAX, RangeObserver, _cosine, _session
from torch_fl.bpu.conversion.layer_check import alone_model, with_outputs
from torch_fl.bpu.conversion.layer_select import module_paths
from torch_fl.bpu.conversion.qdq import QMAX16, WEIGHT_OPS, is_wide, quantize_model
from torch_fl.bpu.errors import CalibrationRunError
from torch_fl.bpu.report import WORST_LAYERS

WORST_IN_EXPLAIN = 3


@dataclass
class LayerRow:
    partition: int
    index: int
    module: str
    op: str
    precision: str
    scale: float | None
    saturated_pct: float
    zeroed_pct: float
    cosine_alone: float
    cosine_accumulated: float
    onnx_node: str


class LayerReport:
    """Rows per quantized layer, in network order, for every partition that ran."""

    def __init__(self, rows: list[LayerRow]) -> None:
        self.rows = rows

    def worst(self, n: int = WORST_IN_EXPLAIN) -> list[LayerRow]:
        return sorted(self.rows, key=lambda r: r.cosine_alone)[:n]

    def to_dict(self) -> list[dict]:
        return [asdict(r) for r in self.rows]

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def save(self, path: str | os.PathLike[str]) -> None:
        atomic.write_text(path, self.to_json())

    def table(self) -> str:
        head = (
            f"{'part':>4} {'#':>3} {'module':<28} {'op':<6} {'prec':<5} {'scale':>9} "
            f"{'sat%':>6} {'zero%':>6} {'alone':>8} {'accum':>8}"
        )
        lines = [head]
        for r in self.rows:
            scale = f"{r.scale:9.3g}" if r.scale is not None else f"{'-':>9}"
            module = r.module if len(r.module) <= 28 else "..." + r.module[-25:]
            lines.append(
                f"{r.partition:>4} {r.index:>3} {module:<28} {r.op:<6} {r.precision:<5} {scale} "
                f"{r.saturated_pct:6.2f} {r.zeroed_pct:6.2f} {r.cosine_alone:8.5f} "
                f"{r.cosine_accumulated:8.5f}"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def plot(self, path: str | os.PathLike[str]) -> Path:
        """Cosine per layer in network order (alone and accumulated) as a PNG at `path`."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        dest = Path(path)
        fig, ax = plt.subplots(figsize=(max(7, 0.18 * len(self.rows)), 4))
        xs = range(len(self.rows))
        ax.plot(xs, [r.cosine_alone for r in self.rows], "o-", ms=3, label="layer alone")
        ax.plot(xs, [r.cosine_accumulated for r in self.rows], "s-", ms=3, label="accumulated")
        ax.set_xticks(list(xs), [r.module or r.onnx_node for r in self.rows], rotation=90,
                      fontsize=6)  # fmt: skip
        ax.set_ylabel("cosine vs float")
        ax.set_title("per-layer quantization error (calibration samples)")
        ax.legend()
        fig.tight_layout()
        with atomic.replacing(dest) as tmp:
            fig.savefig(tmp, format="png", dpi=110)
        plt.close(fig)
        return dest


def _partition_rows(index: int, part, observer: RangeObserver, feeds: list[dict]) -> list[LayerRow]:
    model = observer.model
    scales, default = dict(part.scales or {}), part.settings.act_scale
    precision = part.effective_precision(model)
    paths = module_paths(part.spec.gm, model)
    inits = {i.name for i in model.graph.initializer}
    layers = [
        n for n in model.graph.node
        if n.op_type in WEIGHT_OPS and len(n.input) > 1 and n.input[WEIGHT_OPS[n.op_type]] in inits
    ]  # fmt: skip
    outs = [n.output[0] for n in layers]
    ref_model = with_outputs(model, outs)
    full = with_outputs(quantize_model(model, scales, default, precision), outs)
    ref_s, full_s = _session(ref_model), _session(full)
    names = [o.name for o in ref_model.graph.output]
    refs = [dict(zip(names, ref_s.run(names, f), strict=True)) for f in feeds]
    fulls = [dict(zip(names, full_s.run(names, f), strict=True)) for f in feeds]
    acts = observer.names
    values = (
        [dict(zip(acts, observer.session.run(acts, f), strict=True)) for f in feeds] if acts else []
    )
    rows = []
    by_name = {i.name: i for i in model.graph.initializer}
    for i, node in enumerate(layers):
        act = node.input[0]
        prec = precision.get(act, "int8")
        out = node.output[0]
        # alone: this op by itself, its input quantized as in the partition, fed the float
        # network's own value of that input
        inputs = [v.get(act) if act in acts else None for v in values] or [None] * len(feeds)
        first = inputs[0] if inputs[0] is not None else feeds[0][act]
        shapes = (list(np.asarray(first).shape), list(np.asarray(refs[0][out]).shape))
        alone_s = _session(alone_model(model, node, by_name, scales, default, prec, shapes))
        cos_alone = min(
            _cosine(np.asarray(alone_s.run([out], {act: x if x is not None else f[act]})[0]),
                    np.asarray(r[out]))
            for x, f, r in zip(inputs, feeds, refs, strict=True)
        )  # fmt: skip
        cos_acc = min(
            _cosine(np.asarray(q[out]), np.asarray(r[out]))
            for q, r in zip(fulls, refs, strict=True)
        )
        sat = zero = count = nonzero = 0
        scale = scales.get(act)
        if scale and act in acts and prec != "float":
            step = scale * QMAX / QMAX16 if is_wide(prec) else scale
            top = QMAX16 if is_wide(prec) else QMAX
            for v in values:
                ratio = np.abs(np.asarray(v[act], np.float32)) / step
                count += ratio.size
                sat += int(np.count_nonzero(ratio > top + 0.5))
                nz = ratio > 0
                nonzero += int(np.count_nonzero(nz))
                zero += int(np.count_nonzero(nz & (ratio < 0.5)))
        rows.append(
            LayerRow(
                partition=index,
                index=i,
                module=paths.get(node.name or node.output[0], ""),
                op=node.op_type,
                precision=prec,
                scale=scale,
                saturated_pct=round(100.0 * sat / max(count, 1), 4),
                zeroed_pct=round(100.0 * zero / max(nonzero, 1), 4),
                cosine_alone=round(cos_alone, 6),
                cosine_accumulated=round(cos_acc, 6),
                onnx_node=node.name or node.output[0],
            )  # fmt: skip
        )
    return rows


def layer_report(
    compiled_model: Any,
    samples: Iterable[Any],
    json_path: str | os.PathLike[str] | None = None,
    plot_path: str | os.PathLike[str] | None = None,
) -> LayerReport:
    """Per-layer quantization error of a model compiled with backend="bpu" (and calibrated:
    the scales the partitions hold, else those its calibration finds) on `samples` (as for
    calibrate; at most 8 are measured). Writes JSON / a PNG where asked."""
    from torch_fl.bpu.calibrate import _call, _positional_count, _Session
    from torch_fl.bpu.runtime import partition as runtime

    session = _Session("max", 99.99)
    token = runtime.CALIBRATION.set(session)
    positional = _positional_count(compiled_model)
    seen = 0
    try:
        with torch.no_grad():
            for sample in samples:
                _call(compiled_model, sample, positional)
                seen += 1
                if seen >= 8:
                    break
    finally:
        runtime.CALIBRATION.reset(token)
    if not session.observers:
        raise CalibrationRunError(
            "layer_report: no BPU partition ran. Pass the object torch.compile(model, "
            "backend='bpu') returned, and at least one sample"
        )
    rows: list[LayerRow] = []
    for ident, (part, observer) in session.observers.items():
        if not part.recall_scales(session.keys[ident]):
            raise CalibrationRunError(
                f"layer_report: partition {part.spec.index} is not calibrated. Fix: "
                "torch_fl.bpu.calibrate(compiled, samples) first"
            )
        feeds = [dict(zip(observer.input_names, i, strict=False)) for i in observer.kept_inputs]
        rows.extend(_partition_rows(part.spec.index, part, observer, feeds))
    report = LayerReport(rows)
    for part, _ in session.observers.values():
        mine = [r for r in report.worst(len(rows)) if r.partition == part.spec.index]
        part.entry.worst_layers = [
            {"module": r.module or r.onnx_node, "op": r.op, "precision": r.precision,
             "cosine_alone": r.cosine_alone} for r in mine[:WORST_IN_EXPLAIN]
        ]  # fmt: skip
        WORST_LAYERS[part.spec.fingerprint] = part.entry.worst_layers
    if json_path is not None:
        report.save(json_path)
    if plot_path is not None:
        report.plot(plot_path)
    return report

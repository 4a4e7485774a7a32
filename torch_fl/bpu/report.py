"""Coverage report: what went to the BPU, what stayed on the CPU and why. Table and JSON.

Each compiled graph owns a `GraphReport`; partitions update their entry when their executor is
resolved (first call). `torch_fl.bpu.explain(model, *inputs)` (explainer.py) compiles and runs
the model once and returns a `Report` over all graphs (several when Dynamo breaks the graph).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

_COLLECTOR: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "torch_fl_bpu_report_collector", default=None
)
_RAN: list | None = None
"""While `ran()` is active: the reports of the graphs that ran (explain on a compiled model).
A module global, not a context variable: the hot path pays one global read per graph call."""


@dataclass
class PartitionEntry:
    id: int
    name: str
    compute_nodes: int
    nodes: int
    inputs: list
    outputs: list
    frozen_params: int
    executor: str
    executor_reason: str = ""
    artifact_key: str | None = None
    cache_hit: bool | None = None
    fingerprint: str = ""
    quant_health: dict | None = None
    """int8 vs float on the calibration samples (cosine, saturated/zeroed %), once calibrated."""
    sim_kernels: dict | None = None
    """sim executor only: {"path": u8s8|u8u8|float, "reason": why this CPU got it}."""
    sim_threads: dict | None = None
    """sim executor only: {"threads": ORT intra-op threads, "reason": why, "times_ms": the
    median per call at each count measured (runtime/sim_threads.py), or None}."""
    weight_check: dict | None = None
    """Baked weights only: how each call checks them (FrozenWeights.describe()): {"beside":
    on the checker thread during the call or before it, "threads": CPUs hashing, "pass":
    xxh3|native, "timed_us": both passes timed on first use, or None}."""
    calibration: dict | None = None
    """{"state": calibrated|uncalibrated|float, "source": where the scales came from}; set on
    the first call of an int8 partition."""
    worst_layers: list | None = None
    """The layers with the lowest alone-cosine of the last layer_report (module, op, ...)."""


WORST_LAYERS: dict[str, list] = {}
"""Partition fingerprint -> the worst layers of its last layer_report (for every later graph of
the same partition: explain() after a recompile shows them too)."""


@dataclass
class GraphReport:
    graph_id: int
    partitions: list[PartitionEntry] = field(default_factory=list)
    cpu_nodes: list[dict] = field(default_factory=list)
    compute_total: int = 0
    rewrites: dict = field(default_factory=dict)
    grad_mode: str = "inference"
    """inference, eval-inference (grad on, eval model: run as inference) or host-training."""

    @property
    def compute_in_partitions(self) -> int:
        return sum(p.compute_nodes for p in self.partitions)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["compute_in_partitions"] = self.compute_in_partitions
        data["coverage_pct"] = _pct(self.compute_in_partitions, self.compute_total)
        return data


def _pct(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 2) if whole else 100.0


class Report:
    """All graphs of one compiled model."""

    def __init__(self, graphs: list[GraphReport], graph_breaks: list[dict] | None = None) -> None:
        self.graphs = graphs
        # Where Dynamo stopped tracing: the code from there ran eagerly on the CPU, outside every
        # graph (and outside the coverage numbers). Filled by explain().
        self.graph_breaks = list(graph_breaks or [])

    @property
    def partitions(self) -> list[PartitionEntry]:
        return [p for g in self.graphs for p in g.partitions]

    @property
    def cpu_nodes(self) -> list[dict]:
        return [n for g in self.graphs for n in g.cpu_nodes]

    @property
    def compute_total(self) -> int:
        return sum(g.compute_total for g in self.graphs)

    @property
    def coverage_pct(self) -> float:
        """% of compute nodes inside BPU partitions."""
        return _pct(sum(g.compute_in_partitions for g in self.graphs), self.compute_total)

    @property
    def offloaded_pct(self) -> float:
        """% of compute nodes whose partition runs BPU numerics (hbm or sim), not eager."""
        done = sum(p.compute_nodes for p in self.partitions if p.executor in ("hbm", "sim"))
        return _pct(done, self.compute_total)

    def to_dict(self) -> dict[str, Any]:
        return {
            "graphs": [g.to_dict() for g in self.graphs],
            "compute_total": self.compute_total,
            "coverage_pct": self.coverage_pct,
            "offloaded_pct": self.offloaded_pct,
            "executors": sorted({p.executor for p in self.partitions}),
            "sim_kernels": sorted(
                {p.sim_kernels["path"] for p in self.partitions if p.sim_kernels}
            ),
            "graph_breaks": self.graph_breaks,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def table(self) -> str:
        """The explain() text: coverage, one row per partition, then each section that applies."""
        lines = [
            f"BPU coverage: {sum(g.compute_in_partitions for g in self.graphs)}/"
            f"{self.compute_total} compute nodes in {len(self.partitions)} partition(s) "
            f"({self.coverage_pct}%), running BPU numerics: {self.offloaded_pct}%"
        ]
        for section in (
            self._partition_rows,
            self._kernel_lines,
            self._thread_lines,
            self._check_lines,
            self._calibration_lines,
            self._break_lines,
            self._health_lines,
            self._worst_layer_lines,
            self._cpu_lines,
        ):
            lines += section()
        return "\n".join(lines)

    def _partition_rows(self) -> list[str]:
        head = f"{'graph':>5} {'part':>4} {'executor':<8} {'compute':>7} {'nodes':>5} "
        lines = [head + f"{'frozen':>6}  inputs -> outputs"]
        for g in self.graphs:
            for p in g.partitions:
                shapes = f"{_shapes(p.inputs)} -> {_shapes(p.outputs)}"
                lines.append(
                    f"{g.graph_id:>5} {p.id:>4} {p.executor:<8} {p.compute_nodes:>7} "
                    f"{p.nodes:>5} {p.frozen_params:>6}  {shapes}"
                    + (f"  ({p.executor_reason})" if p.executor_reason else "")
                )
        return lines

    def _kernel_lines(self) -> list[str]:
        kernels = {
            (p.sim_kernels["path"], p.sim_kernels["reason"])
            for p in self.partitions
            if p.sim_kernels and p.executor == "sim"
        }
        lines = [f"sim kernels: {path} ({why})" for path, why in sorted(kernels)]
        lookups = [
            (g.graph_id, p.id, p.sim_kernels["lookups"], p.sim_kernels.get("lookup_kernel"))
            for g in self.graphs
            for p in g.partitions
            if p.sim_kernels and p.executor == "sim" and p.sim_kernels.get("lookups")
        ]
        lines += [
            f"sim lookups: graph {gid} part {pid}: {n} elementwise chains as 8-bit table lookups"
            + (f" ({form})" if form else "")
            for gid, pid, n, form in lookups
        ]
        # what the sim moved off ONNX Runtime's own kernels, per partition
        moved = (
            ("narrow_convs", "sim narrow convs", "integer conv{s} with few channels as exact "
             "float convs (conversion/narrow_convs.py)"),
            ("depthwise", "sim depthwise convs", "depthwise int8 conv{s} on the extension's "
             "AVX-512 / AVX2 kernel, bit-equal to ONNX Runtime's (conversion/depthwise.py)"),
            ("grouped", "sim grouped convs", "grouped int8 conv{s} of narrow groups on the "
             "extension's AVX-512 / VNNI kernels, bit-equal to ONNX Runtime's "
             "(conversion/grouped_conv.py)"),
            ("pools", "sim max pools", "channels-first 8-bit max pool{s} on the extension's "
             "op, bit-equal to ONNX Runtime's (conversion/max_pool.py)"),
            ("concats", "sim concats", "8-bit concat{s} on the extension's op, the byte lookups "
             "feeding each folded into its requantization, bit-equal to ONNX Runtime's "
             "(conversion/concat_lookup.py)"),
            ("narrow_ops", "sim narrow convs", "narrow int8 conv{s} on the extension's VNNI / "
             "AVX2 kernel, bit-equal to ONNX Runtime's (conversion/narrow_op.py)"),
            ("lookup_means", "sim lookup means", "float lookup{s} and the ReduceMean over each as "
             "one op, float for float (conversion/lookup_mean.py)"),
            ("gemv", "sim one-row GEMMs", "one-row int8 GEMM{s} (QGemms, 1x1 convs over one "
             "pixel) on the extension's VNNI kernel, "
             "split over the session's threads, bit-equal to ONNX Runtime's (conversion/gemv.py)"),
            ("pair_gemms", "sim pair GEMMs", "1x1 int8 conv{s} or GEMM{s} with uint8 weights on "
             "the extension's exact AVX2 16-bit kernel, bit-equal to ONNX Runtime's u8u8 ones "
             "(conversion/pair_gemm.py)"),
            ("folded_clamps", "sim folded clamps", "byte clamp{s} (a ReLU's, a ReLU6's) folded "
             "into the output step of the extension's op it reads (conversion/clamp_fold.py)"),
        )  # fmt: skip
        lines += [
            f"{label}: graph {g.graph_id} part {p.id}: {n} " + what.format(s="s" * (n != 1))
            for key, label, what in moved
            for g in self.graphs
            for p in g.partitions
            if p.sim_kernels and p.executor == "sim"
            for n in [p.sim_kernels.get(key, 0)]
            if n
        ]
        return lines

    def _thread_lines(self) -> list[str]:
        return [
            f"sim threads: graph {g.graph_id} part {p.id}: {p.sim_threads['threads'] or 'ORT default'}"
            f" ({p.sim_threads['reason']})"
            for g in self.graphs
            for p in g.partitions
            if p.sim_threads and p.executor == "sim"
        ]

    def _check_lines(self) -> list[str]:
        lines = []
        for g in self.graphs:
            for p in g.partitions:
                check = p.weight_check
                if not check:
                    continue
                where = "beside the call" if check["beside"] else "before the call"
                cpus = f"{check['threads']} CPU{'s' * (check['threads'] > 1)}"
                timed = check.get("timed_us")
                when = check.get("timed_when", "on first use")
                why = (
                    f"; timed {when}: " + ", ".join(f"{k} {v:g} us" for k, v in timed.items())
                    if timed
                    else ""
                )
                # the watch's state, or (hashing every weight) why no watch runs
                note = check.get("watch")
                label = "" if check["pass"] == "write-watch" else "write watch: "
                watch = f" ({label}{note})" if note else ""
                lines.append(
                    f"weight check: graph {g.graph_id} part {p.id}: {where}, {check['pass']} "
                    f"on up to {cpus}{why}{watch}"
                )
        return lines

    def _calibration_lines(self) -> list[str]:
        calibrations = [(g.graph_id, p) for g in self.graphs for p in g.partitions if p.calibration]
        if not calibrations:
            return []
        lines = ["calibration: graph/part state (source)"]
        for graph_id, p in calibrations:
            cal = p.calibration
            flag = "  DEFAULT SCALE" if cal["state"] == "uncalibrated" else ""
            lines.append(f"  {graph_id}/{p.id} {cal['state']} ({cal['source']}){flag}")
        return lines

    def _break_lines(self) -> list[str]:
        lines = []
        if self.graph_breaks:
            lines.append(
                f"Dynamo graph breaks: {len(self.graph_breaks)} (the code after each ran eagerly "
                "on the CPU and is not counted above):"
            )
            lines += [f"  {brk['where']}: {brk['reason']}" for brk in self.graph_breaks]
        host = [g for g in self.graphs if g.grad_mode == "host-training"]
        if host:
            lines.append(
                f"grad mode: {len(host)} graph(s) ran on the host as training graphs "
                "(see the reasons below)"
            )
        return lines

    def _health_lines(self) -> list[str]:
        healths = [(g.graph_id, p) for g in self.graphs for p in g.partitions if p.quant_health]
        if not healths:
            return []
        lines = ["int8 health (calibration samples): graph/part cosine sat% zeroed% worst"]
        for graph_id, p in healths:
            h = p.quant_health
            worst = h.get("worst_tensor", {})
            flag = "  LOW" if h["cosine"] < 0.99 else ""
            lines.append(
                f"  {graph_id}/{p.id} {h['cosine']:.5f} {h['saturated_pct']:.3f} "
                f"{h['zeroed_pct']:.3f} {worst.get('name', '-')}{flag}"
            )
            # calibrate(target=...): the layers int16 was not enough for (layer_check.py)
            lines += [f"  {graph_id}/{p.id} {s['message']}" for s in h.get("int16_short", ())]
        return lines

    def _worst_layer_lines(self) -> list[str]:
        worst = [
            (g.graph_id, p, p.worst_layers or WORST_LAYERS.get(p.fingerprint))
            for g in self.graphs
            for p in g.partitions
        ]
        worst = [w for w in worst if w[2]]
        if not worst:
            return []
        lines = ["worst layers (layer_report, alone vs float): graph/part module op prec cos"]
        for graph_id, p, rows in worst:
            for w in rows:
                lines.append(
                    f"  {graph_id}/{p.id} {w['module']} {w['op']} {w['precision']} "
                    f"{w['cosine_alone']:.5f}"
                )
        return lines

    def _cpu_lines(self) -> list[str]:
        if not self.cpu_nodes:
            return []
        lines = ["left on the CPU:"]
        lines += [f"  {n['node']:<28} {n['target']:<40} {n['reason']}" for n in self.cpu_nodes]
        return lines

    def __str__(self) -> str:
        return self.table()


def _shapes(shapes: list) -> str:
    return ", ".join("x".join(map(str, s)) if s is not None else "?" for s in shapes) or "-"


def register(report: GraphReport) -> None:
    collector = _COLLECTOR.get()
    if collector is not None:
        collector.append(report)


@contextlib.contextmanager
def collect() -> Iterator[list[GraphReport]]:
    reports: list[GraphReport] = []
    token = _COLLECTOR.set(reports)
    try:
        yield reports
    finally:
        _COLLECTOR.reset(token)


def noting(report: GraphReport, forward: Callable) -> Callable:
    """`forward`, noting `report` in the active `ran()` list on each call."""

    def run(*args):
        seen = _RAN
        if seen is not None:
            seen.append(report)
        return forward(*args)

    return run


@contextlib.contextmanager
def ran() -> Iterator[list[GraphReport]]:
    """The reports of the compiled graphs that run inside the block, in call order."""
    global _RAN
    outer, seen = _RAN, []
    _RAN = seen
    try:
        yield seen
    finally:
        _RAN = outer
        if outer is not None:
            outer.extend(seen)


def graph_breaks(model: torch.nn.Module, *inputs: Any) -> list[dict]:
    """Where Dynamo stops tracing `model` (a second trace with Dynamo's own explain)."""
    try:
        result = torch._dynamo.explain(model)(*inputs)
    except Exception as exc:  # the report must not fail because the diagnosis did
        return [{"where": "?", "reason": f"could not trace for graph breaks: {exc}"}]
    breaks = []
    for brk in result.break_reasons:
        frame = brk.user_stack[-1] if brk.user_stack else None
        where = f"{frame.filename}:{frame.lineno} ({frame.line})" if frame is not None else "?"
        reason = str(brk.reason).strip().splitlines()[0] if str(brk.reason).strip() else "?"
        if "rnn" in (frame.line or "").lower() or any(
            k in (frame.line or "") for k in ("lstm", "gru", "LSTM", "GRU")
        ):
            reason += " (nn.LSTM/GRU/RNN: set torch._dynamo.config.allow_rnn = True to trace it)"
        breaks.append({"where": where, "reason": reason})
    return breaks

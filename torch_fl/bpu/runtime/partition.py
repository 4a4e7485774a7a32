"""The module that replaces each fused partition in the compiled graph.

Call path (hot): one attribute read, for executors that bake the weights (hbm; sim with
sim_weights="checked", the default) a baked-weight check (identity and content fingerprint per
weight; eager and live sim read the weights live and need none), an optional profiler range, the
executor. Everything else — building the artifact,
calibration, stale rebuilds, fallbacks — happens on the slow path, taken on the first call and
whenever the fast path's preconditions fail.
"""

from __future__ import annotations

import contextvars
import logging
import os
import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch.autograd.profiler import record_function

from torch_fl.bpu.build import BuildResult, PartitionSpec, export_float
from torch_fl.bpu.build import build as build_partition
from torch_fl.bpu.conversion import calibration_store as stored
from torch_fl.bpu.conversion.calibration import RangeObserver, health
from torch_fl.bpu.conversion.freezing import FrozenWeights
from torch_fl.bpu.conversion.qdq import activation_inputs
from torch_fl.bpu.errors import CalibrationError, StrictModeError
from torch_fl.bpu.report import PartitionEntry
from torch_fl.bpu.runtime import sim_threads
from torch_fl.bpu.runtime.executors import EagerExecutor, Executor, OnDevice
from torch_fl.bpu.runtime.registry import EXECUTORS, make_executor
from torch_fl.bpu.settings import BpuSettings
from torch_fl.host_view import cpu_views, device_of

log = logging.getLogger("torch_fl.bpu")
_profiler_enabled = torch.autograd._profiler_enabled

# Set by torch_fl.bpu.calibrate(): partitions record activation ranges instead of executing.
CALIBRATION: contextvars.ContextVar = contextvars.ContextVar("torch_fl_bpu_calib", default=None)


class PartitionRuntime(torch.nn.Module):
    def __init__(
        self,
        spec: PartitionSpec,
        settings: BpuSettings,
        executor: str,
        reason: str,
        entry: PartitionEntry,
    ) -> None:
        super().__init__()
        self.spec = spec
        self.eager = spec.gm
        self.settings = settings
        self.planned = executor
        self.entry = entry
        self.scales: dict[str, float] | None = None
        """Set by calibrate() or found on the first call (`_find_scales`); kept across rebuilds."""
        self.precision: dict[str, str] = {}
        """Activation tensors kept in int16 or float (calibrate(target=...)); int8 else."""
        self.bias: dict[str, list[float]] = {}
        """Bias correction: bias tensor -> delta per channel (calibrate(bias_correction=True))."""
        self._guessed_scales = False
        """self.scales were measured on one first call (not by calibrate() or a record)."""
        self.last_build: BuildResult | None = None
        self.builds = 0
        self._exec: Executor | None = None
        self._frozen: FrozenWeights | None = None
        self._confirm: sim_threads.Confirmation | None = None
        """The first call's thread choice, being checked on the calls that follow."""
        self._set_kind(executor, reason)

    # -- hot path -----------------------------------------------------------------------------
    def forward(self, *args: torch.Tensor):
        run = self._exec
        if run is None or CALIBRATION.get() is not None or self._confirm is not None:
            return self._slow(args)
        frozen = self._frozen
        if frozen is None:
            return self._call(run, args)
        if not frozen.overlap:
            if frozen.stale(args):
                return self._slow(args)
            return self._call(run, args)
        # large baked weights: check them on the checker thread while the executor runs on
        # its own copy; a result computed while they were found changed is thrown away
        changed = frozen.check_in_background(args)
        try:
            out = self._call(run, args)
        finally:
            stale = changed()  # never return while the check still reads the weights
        if stale:
            return self._slow(args)
        return out

    # Called straight from the compiled graph's code: nn.Module's call machinery (hook lookups,
    # two more frames) runs nothing for a partition and costs a few microseconds a call once an
    # int8 session has emptied the caches. Module hooks on a partition runtime do not run.
    __call__ = forward

    def _call(self, run: Executor, args: Sequence[torch.Tensor]):
        if _profiler_enabled():
            with record_function(self._label):
                return run(args)
        return run(args)

    # -- slow path ----------------------------------------------------------------------------
    def _set_kind(self, kind: str, reason: str = "") -> None:
        self.kind = kind
        self._label = f"bpu::partition{self.spec.index}[{kind}]"
        self.entry.executor = kind
        self.entry.executor_reason = reason

    def _slow(self, args: Sequence[torch.Tensor]):
        session = CALIBRATION.get()
        if session is not None:
            # the observer's float run computed the outputs too: one run per sample, not two
            outs = session.observe(self, args)
            return outs if outs is not None else self.eager(*args)
        if self._confirm is not None and self._exec is not None:
            return self._confirming(args)
        if self._frozen is not None and self._exec is not None:
            # The weights this artifact baked in changed (load_state_dict, optimizer step...).
            if self.settings.on_stale == "eager":
                warnings.warn(
                    f"torch_fl.bpu: partition {self.spec.index}: frozen weights changed in "
                    "place; running it eagerly from now on (on_stale='eager')",
                    stacklevel=3,
                )
                self._use_eager("weights changed after compilation (on_stale='eager')")
                return self.forward(*args)
            log.info("partition %d: weights changed, rebuilding", self.spec.index)
            if self._guessed_scales:
                # scales guessed on a first call belong to the old weights: guess again (or
                # find a calibration of the new ones); calibrate()'s scales are kept
                self.scales = None
        self._prepare(args)
        return self.forward(*args)

    def _confirming(self, args: Sequence[torch.Tensor]):
        """One call of the thread choice's confirmation (sim_threads.Confirmation): run it on
        the count the plan names, timed whole; once the plan is done, keep the faster count."""
        confirm, run = self._confirm, self._exec
        inner = getattr(run, "inner", run)
        count = confirm.next_count()
        if count is None or confirm.pid != os.getpid():
            self._confirm = None
            if confirm.pid == os.getpid():  # a forked child has none of the trial sessions
                self._keep_threads(inner, confirm)
            return self.forward(*args)
        self._run_on(inner, count, switch=True)
        self._confirm = None  # the call below takes the hot path
        start = time.perf_counter()
        try:
            out = self.forward(*args)
        finally:
            # a call that rebuilt the partition (its weights changed) set up its own choice
            if self._confirm is None and self._exec is run:
                self._confirm = confirm
        if self._confirm is confirm:
            confirm.record(time.perf_counter() - start)
        return out

    def _run_on(self, inner: Executor, threads: int, switch: bool = False) -> None:
        if switch:
            inner.switch_threads(threads)
        else:
            inner.use_threads(threads)
        if self._frozen is not None:
            self._frozen.occupy(threads)

    def _keep_threads(self, inner: Executor, confirm: sim_threads.Confirmation) -> None:
        """The confirmation is done: keep its faster count, and say so in explain()."""
        best = confirm.best()
        first = self.entry.sim_threads or {}
        self._run_on(inner, best)
        medians = confirm.medians_ms()
        shown = ", ".join(f"{n} thread{'s' * (n > 1)} {t:g} ms" for n, t in sorted(medians.items()))
        kept = "kept" if best == first.get("threads") else f"changed to {best}"
        measured = first.get("reason", "").removesuffix(sim_threads.PENDING)
        self.entry.sim_threads = {
            **first,
            "threads": best,
            "reason": f"{measured}; {kept} on the next calls ({shown}: medians of whole calls)",
            "confirmed_ms": medians,
        }

    def _use_eager(self, reason: str) -> None:
        self._confirm = None
        self._exec = EagerExecutor(self.eager)
        self._frozen = None
        self.entry.sim_kernels = None
        self.entry.sim_threads = None
        self.entry.weight_check = None
        self._set_kind("eager", reason)

    def invalidate(self) -> None:
        """Forget the artifact: the next call rebuilds (used after calibration)."""
        self._exec = None
        self._frozen = None
        self._confirm = None

    def set_scales(
        self,
        scales: dict[str, float],
        source: str = "calibrate()",
        precision: dict[str, str] | None = None,
        bias: dict[str, list[float]] | None = None,
    ) -> None:
        self.scales = dict(scales)
        self.precision = dict(precision or {})
        self.bias = dict(bias or {})
        self._calibrated(source)
        self.invalidate()

    def _calibrated(self, source: str, state: str = "calibrated", guessed: bool = False) -> None:
        self.entry.calibration = {"state": state, "source": source}
        self._guessed_scales = guessed

    def calibration_keys(self, host_args: Sequence[Any]) -> stored.Keys:
        """The store keys of this partition's calibration with the weights in `host_args`."""
        weights = stored.weights_digest(host_args[p] for p in self.spec.frozen_positions)
        return stored.keys(self.spec.fingerprint, self.spec.family, weights)

    # -- calibrating this partition: shared by the first call and calibrate() ----------------
    def range_observer(
        self, host: Sequence[torch.Tensor], method: str, percentile: float
    ) -> RangeObserver:
        """A range observer on this partition's float ONNX graph (exported with `host`)."""
        return RangeObserver(export_float(self.spec, host), method, percentile)

    def observe_inputs(
        self, observer: RangeObserver, host: Sequence[torch.Tensor], record: bool = True
    ) -> tuple[torch.Tensor, ...] | None:
        """Feed `observer` one call's runtime inputs (the frozen weights are in its graph); the
        float outputs that run computed, as this partition returns them, or None where they do
        not match its outputs' shapes (the caller then runs the partition itself). With `record`
        False the float graph runs and nothing is recorded (a replay for another partition)."""
        inputs = [host[i].detach().numpy() for i in self.spec.runtime_positions]
        outs = observer.observe(inputs) if record else observer.outputs(inputs)
        shapes = self.entry.outputs
        if len(outs) != len(shapes) or any(
            shape is not None and tuple(o.shape) != tuple(shape)
            for o, shape in zip(outs, shapes, strict=True)
        ):
            return None
        return tuple(torch.from_numpy(o) for o in outs)

    def record_calibration(
        self,
        observer: RangeObserver,
        scales: dict[str, float],
        keys: stored.Keys,
        source: str,
        samples: int,
        method: str,
        label: str,
        precision: dict[str, str] | None = None,
        warn: bool = True,
        stacklevel: int = 1,
        bias: dict[str, list[float]] | None = None,
    ) -> stored.Record:
        """Calibrating one partition, after observing: the int8 health of `scales` in the report
        (quantized builds), and the record in the calibration store under `keys`. The caller
        then makes them this partition's scales (first call, or `set_scales`). `stacklevel`
        places a poor-health warning as warnings.warn would from the caller."""
        settings = self.settings
        if settings.quantize:
            self.entry.quant_health = health(
                observer, scales, settings.act_scale, label,
                warn=warn, precision=precision, stacklevel=stacklevel + 2, bias=bias,
            )  # fmt: skip
        record = stored.Record(
            scales, tuple(observer.names), source, samples, method,
            {} if precision is None else precision, dict(bias or {}),
        )  # fmt: skip
        stored.STORE.put(keys, record, settings.cache_dir if settings.cache else None)
        return record

    def _find_scales(self, host: Sequence[torch.Tensor]) -> None:
        """Scales for an int8 build: given, stored, carried over from another shape, or
        measured on this call; never the default scale without a warning (docs/compile.md)."""
        settings, spec = self.settings, self.spec
        label = f"partition {spec.index} ({spec.name}, {spec.fingerprint})"
        if self.scales is not None or self._given_scales():
            return
        cache_dir = settings.cache_dir if settings.cache else None
        k = self.calibration_keys(host)
        if self._stored_scales(k, cache_dir) or self._carried_scales(host, k, cache_dir):
            return
        mode = settings.calibrate
        if mode == "require":
            raise CalibrationError(
                f"torch_fl.bpu: {label} has no calibration (calibrate='require'). Fix: run "
                "torch_fl.bpu.calibrate(compiled, samples) before calling the model, or pass "
                "options={'calibration': <saved file>}"
            )
        if mode == "none":
            if stored.STORE.first_warning(spec.fingerprint):
                warnings.warn(
                    f"torch_fl.bpu: {label} runs int8 with the default activation scale "
                    f"{settings.act_scale} (calibrate='none'): its results may be far from "
                    "float. Fix: torch_fl.bpu.calibrate(compiled, samples)",
                    stacklevel=5,
                )
            self._calibrated(f"default act_scale {settings.act_scale}", "uncalibrated")
            return
        self._first_call_scales(host, k, label)

    def recall_scales(self, k: stored.Keys) -> bool:
        """This partition's scales as given or stored (store keys `k`), without calibrating:
        a graph recompiled since calibrate() (explain() re-traces) that has not run yet."""
        if self.scales is not None or self._given_scales():
            return True
        settings = self.settings
        return self._stored_scales(k, settings.cache_dir if settings.cache else None)

    def _given_scales(self) -> bool:
        """options={'calibration': ...} names this very partition: its scales and precision."""
        given = self.settings.calibration
        found = given.for_partition(self.spec.fingerprint) if given is not None else None
        if found is None:
            return False
        self.scales = found
        self.precision = given.precision_for(self.spec.fingerprint)
        self.bias = given.bias_for(self.spec.fingerprint)
        self._calibrated("options={'calibration': ...}")
        return True

    def _stored_scales(self, k: stored.Keys, cache_dir: str | None) -> bool:
        """The store holds a calibration of this graph with these weights: use it."""
        hit = stored.STORE.get(k.exact, cache_dir)
        if hit is None:
            return False
        record, where = hit
        self.scales = record.scales
        self.precision = dict(record.precision)
        self.bias = dict(record.bias)
        self._calibrated(f"{record.source}; found in the {where} store", guessed=record.guessed)
        return True

    def _carried_scales(
        self, host: Sequence[torch.Tensor], k: stored.Keys, cache_dir: str | None
    ) -> bool:
        """The same graph at another input shape: scales carried over by tensor position."""
        given = self.settings.calibration
        family = given.for_family(self.spec.family) if given is not None else None
        hit = stored.STORE.get(k.family, cache_dir)
        if family is None and hit is None:
            return False
        names = activation_inputs(export_float(self.spec, host))
        # a bias correction is per output channel: the same at any input shape
        family_bias = given.bias_for(given.families[self.spec.family]) if family else {}
        for scales, old_names, source, bias in (
            (*family, "options={'calibration': ...}", family_bias) if family else (None,) * 4,
            (hit[0].scales, hit[0].names, hit[0].source, hit[0].bias) if hit else (None,) * 4,
        ):
            carried = stored.carry(scales, old_names, names) if scales else None
            if carried is not None:
                self.scales = carried
                self.bias = dict(bias or {})
                if hit is not None and not family:
                    self.precision = stored.carry_precision(hit[0].precision, old_names, names)
                self._calibrated(
                    f"{source}; carried over from another input shape",
                    guessed=source.startswith(stored.FIRST_CALL),
                )
                return True
        return False

    def _first_call_scales(self, host: Sequence[torch.Tensor], k: stored.Keys, label: str) -> None:
        """No calibration anywhere: measure one on the inputs of this call (calibrate='auto'
        says so once, 'first-call' does not)."""
        settings, spec = self.settings, self.spec
        observer = self.range_observer(host, settings.calib_method, settings.calib_percentile)
        self.observe_inputs(observer, host)
        self.scales = observer.scales()
        source = f"{stored.FIRST_CALL} (1 sample, {settings.calib_method})"
        # stacklevel 3: a poor-health warning points at _prepare's call (_find_scales's caller)
        self.record_calibration(
            observer, self.scales, k, source, 1, settings.calib_method, label, stacklevel=3
        )
        self._calibrated(source, guessed=True)
        if settings.calibrate == "auto" and stored.STORE.first_warning(spec.fingerprint):
            warnings.warn(
                f"torch_fl.bpu: {label} had no calibration; calibrated it on the inputs of its "
                "first call (1 sample). For scales that hold on other inputs run "
                "torch_fl.bpu.calibrate(compiled, representative_samples) once (it is kept for "
                "recompiles and new processes); calibrate='first-call' silences this",
                stacklevel=6,
            )

    def _with_manual_precision(self, host: Sequence[torch.Tensor]) -> dict[str, str]:
        """The precision map for this build (`effective_precision` of its float graph)."""
        settings = self.settings
        if not settings.quantize or not (settings.int16 or settings.dual_int16 or settings.float):
            return dict(self.precision)
        return self.effective_precision(export_float(self.spec, host))

    def effective_precision(self, model) -> dict[str, str]:
        """Calibration's choice, then options={"int16": [...], "dual_int16": [...], "float":
        [...]} over it (each wins over the one before; int16 never lowers calibration's dual
        int16), for this partition's float ONNX `model`; a pattern that names no layer of this
        partition is said once."""
        from torch_fl.bpu.conversion.layer_select import select

        settings = self.settings
        precision = dict(self.precision)
        levels = (("int16", settings.int16), ("dual_int16", settings.dual_int16),
                  ("float", settings.float))  # fmt: skip
        for level, patterns in levels:
            if not patterns:
                continue
            chosen, unused = select(self.spec.gm, model, patterns)
            keep = {"dual_int16"} if level == "int16" else set()
            precision.update({t: level for t in chosen if precision.get(t) not in keep})
            for pattern in sorted(unused):
                if stored.STORE.first_warning(f"{self.spec.fingerprint}:{level}:{pattern}"):
                    warnings.warn(
                        f"torch_fl.bpu: options {level}={pattern!r} names no layer of partition "
                        f"{self.spec.index}: not a module path glob (explain() and "
                        "layer_report() show the paths), an op type (Conv, Gemm, MatMul) or an "
                        "ONNX tensor name",
                        stacklevel=5,
                    )
        return precision

    def _prepare(self, args: Sequence[torch.Tensor]) -> None:
        kind = self.planned
        settings = self.settings
        compile_artifact = settings.compile_artifact == "always"
        if kind == "eager" and not compile_artifact:
            self._use_eager(self.entry.executor_reason)
            return
        if _has_zero_size(args, self.entry.outputs):
            # ONNX Runtime and hbdk4 divide by a zero dimension (SIGFPE kills the process);
            # shapes are static per compiled graph, so this partition is always empty and there
            # is no work to offload (strict mode accepts it).
            self._use_eager("zero-size tensor (runs eagerly)")
            return
        # flagos tensors: zero-copy CPU views for export, numpy and ONNX Runtime
        device = device_of(args)
        host = cpu_views(args) if device is not None else args
        how = EXECUTORS[kind]
        try:
            if settings.quantize:
                self._find_scales(host)
            else:
                self._calibrated("quantize=False", "float")
            precision = self._with_manual_precision(host)
            result = build_partition(
                self.spec, host, settings, self.scales, how.needs_hbm, compile_artifact,
                precision, self.bias,
            )  # fmt: skip
            executor = make_executor(how, self.spec, settings, result)
            if device is not None:
                executor = OnDevice(executor, device)
        except CalibrationError:
            raise  # calibrate='require': the user's decision, never a silent fallback
        except Exception as exc:
            if settings.strict or settings.executor != "auto":
                if settings.strict:
                    raise StrictModeError(
                        f"strict: partition {self.spec.index} could not be offloaded: {exc}"
                    ) from exc
                raise
            warnings.warn(
                f"torch_fl.bpu: partition {self.spec.index} runs eagerly: {exc}", stacklevel=4
            )
            self._use_eager(f"build failed: {type(exc).__name__}")
            return
        self.last_build = result
        self.builds += 1
        self.entry.artifact_key = result.artifact.key if result.artifact else None
        self.entry.cache_hit = result.cache_hit
        if kind == "eager":  # eager execution, artifact compiled for shipping
            self._use_eager(self.entry.executor_reason)
            return
        self._exec = executor
        kernels = getattr(executor, "kernels", None)
        inner = getattr(executor, "inner", executor)  # OnDevice: the sim executor inside
        self.entry.sim_kernels = (
            {
                "path": kernels.path,
                "reason": kernels.reason,
                "lookups": getattr(inner, "lookups", 0),
                "lookup_kernel": _lookup_kernel(),
                "narrow_convs": getattr(inner, "narrow_convs", 0),
                "depthwise": getattr(inner, "depthwise", 0),
                "grouped": getattr(inner, "grouped", 0),
                "pools": getattr(inner, "pools", 0),
                "concats": getattr(inner, "concats", 0),
                "narrow_ops": getattr(inner, "narrow_ops", 0),
                "lookup_means": getattr(inner, "lookup_means", 0),
                "gemv": getattr(inner, "gemv", 0),
                "pair_gemms": getattr(inner, "pair_gemms", 0),
                "folded_clamps": getattr(inner, "folded_clamps", 0),
            }
            if kernels is not None
            else None
        )
        baked = how.baked_weights(settings)
        self._frozen = (
            FrozenWeights(
                self.spec.frozen_positions, args, _busy_cpus(inner), watch=settings.weight_watch
            )
            if baked
            else None
        )
        self._confirm = None
        self.entry.sim_threads = _thread_choice(inner, host, args, self._frozen, settings)
        choice = self.entry.sim_threads or {}
        leading = choice.get("confirm", ())
        if len(leading) > 1:
            first_ms = choice.get("times_ms") or {}
            self._confirm = sim_threads.Confirmation(leading, os.getpid(), first_ms=first_ms)
        self.entry.weight_check = self._frozen.describe() if self._frozen is not None else None
        self._set_kind(kind)


def _lookup_kernel() -> str:
    """Which form of the byte lookup the sim's lookup ops run here (avx512vbmi / neon /
    portable: csrc/runtime/ort_lookup.cpp)."""
    from torch_fl import _C

    return _C._lookup_kernel()


def _busy_cpus(executor: Executor) -> int:
    """CPUs the executor itself keeps busy: the sim executor's ORT threads (0: ORT's default,
    every CPU), one for the others (the hbm executor waits on the BPU)."""
    if executor.kind != "sim":
        return 1
    return getattr(executor, "threads", 0) or sim_threads.usable_cpus()


def _thread_choice(
    executor: Executor,
    host: Sequence[torch.Tensor],
    args: Sequence[torch.Tensor],
    frozen: FrozenWeights | None,
    settings: BpuSettings,
) -> dict | None:
    """The sim executor's ORT thread count, measured where it has candidates (sim_threads.py),
    as explain() shows it; the weight check's overlap follows the count kept."""
    if executor.kind != "sim":
        return None
    candidates = getattr(executor, "thread_candidates", ())
    if not candidates:
        why = (
            "sim_thread_choice='fixed'"
            if settings.sim_thread_choice == "fixed"
            else "the only count (sim_threads=1, or one usable CPU)"
        )
        return {"threads": executor.threads, "reason": why, "times_ms": None}
    session_s = executor.time_threads(host)
    check_s = 0.0
    if frozen is not None:
        check_s = sim_threads.measure({0: lambda: frozen.stale(args)}, 2, pause_s=0.0)[0]
    choice = sim_threads.choose(
        session_s, check_s, frozen.can_overlap if frozen is not None else (lambda n: True)
    )
    # the two fastest stay open: the next calls confirm the choice (sim_threads.Confirmation)
    # (the first call runs the confirmation's first block: on the count chosen, `ranked[0]`)
    leading = choice.ranked[:2]
    executor.use_threads(choice.threads, keep=leading)
    if frozen is not None:
        frozen.occupy(choice.threads)
    return {
        "threads": choice.threads,
        "reason": choice.reason + (sim_threads.PENDING if len(leading) > 1 else ""),
        "times_ms": choice.times_ms,
        "confirm": leading,
    }


def _has_zero_size(args: Sequence[torch.Tensor], output_shapes: Sequence) -> bool:
    if any(isinstance(a, torch.Tensor) and a.numel() == 0 for a in args):
        return True
    return any(shape is not None and 0 in shape for shape in output_shapes)

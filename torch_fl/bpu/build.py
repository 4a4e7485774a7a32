"""Turn one partition into artifacts: export -> bake weights -> Q/DQ -> cache -> hbdk4.

Each build yields two graphs from one export: `model.onnx`, the quantized graph with the weights
baked in (what the cache key hashes and hbdk4 compiles), and `model.live.onnx`, the same graph
reading the weights as inputs and quantizing them on every call (what the sim executor runs, so
it never runs stale weights). See conversion/live_weights.py.

The fast path for a fresh process is the graph key: a hash of the FX graph, the runtime input
shapes, every frozen weight byte, the quantization settings and scales and the march. The cache
index maps it to artifact keys, so a warm cache loads the artifact with no ONNX export and no
compiler call. On a miss the canonical quantized ONNX bytes give the artifact key proper.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import fx
from torch.utils._python_dispatch import _disable_current_modes

from torch_fl.bpu.cache import Artifact, ArtifactCache, artifact_key
from torch_fl.bpu.conversion import live_weights
from torch_fl.bpu.conversion.export import OPSET, canonical_bytes, export_onnx
from torch_fl.bpu.conversion.fold_bn import fold_batchnorm
from torch_fl.bpu.conversion.qdq import add_to_biases, effective_scales, quantize_model
from torch_fl.bpu.drivers import CompilerInfo, compile_onnx, discover
from torch_fl.bpu.errors import CompileError
from torch_fl.bpu.settings import BpuSettings

PIPELINE_VERSION = "torch-fl-bpu-3"  # 3: BN folded, conv/gemm outputs requantized
LIVE_MODEL = "model.live.onnx"


@dataclass
class PartitionSpec:
    """What the partitioner decided about one partition; fixed for the compiled graph."""

    index: int
    name: str
    gm: fx.GraphModule
    frozen_positions: tuple[int, ...]
    runtime_positions: tuple[int, ...]
    input_names: tuple[str, ...]
    n_outputs: int
    fingerprint: str = ""
    graph_partitions: int = 1
    """How many partitions the compiled graph holds, this one among them (not in the fingerprint:
    it changes how the partition runs, not what it computes)."""

    def __post_init__(self) -> None:
        if not self.fingerprint:
            h = hashlib.sha256(self.gm.code.encode())
            for node in self.gm.graph.nodes:
                if node.op == "placeholder":
                    val = node.meta.get("val")
                    shape = tuple(val.shape) if isinstance(val, torch.Tensor) else None
                    h.update(repr((node.name, shape, getattr(val, "dtype", None))).encode())
            h.update(repr(self.frozen_positions).encode())
            self.fingerprint = h.hexdigest()[:20]

    @property
    def family(self) -> str:
        """The fingerprint with shapes left out: the same graph at another input shape."""
        from torch_fl.bpu.conversion.calibration_store import family_of

        return family_of(self.gm)

    @property
    def output_names(self) -> list[str]:
        return [f"output_{i}" for i in range(self.n_outputs)]

    @property
    def weight_names(self) -> tuple[str, ...]:
        """ONNX input names of the frozen weights: their placeholders' names."""
        placeholders = [n.name for n in self.gm.graph.nodes if n.op == "placeholder"]
        return tuple(placeholders[i] for i in self.frozen_positions)


@dataclass
class BuildResult:
    artifact: Artifact | None
    onnx_bytes: bytes
    live_bytes: bytes
    graph_key: str
    cache_hit: bool
    exported: bool
    compiled: bool
    compiler_id: str
    timings: dict = field(default_factory=dict)
    hbm_path: str | None = None
    temporary: bool = False
    """hbm_path lies in a temporary directory (no cache) that the caller removes after loading."""


def graph_key(
    spec: PartitionSpec,
    args: Sequence[torch.Tensor],
    settings: BpuSettings,
    scales: dict[str, float] | None,
    precision: dict[str, str] | None = None,
    bias: Mapping[str, Sequence[float]] | None = None,
) -> str:
    h = hashlib.sha256()
    header = {
        "pipeline": PIPELINE_VERSION,
        "torch": torch.__version__,
        "opset": OPSET,
        "march": settings.march,
        "quantize": settings.quantize,
        "act_scale": settings.act_scale,
        "scales": sorted((scales or {}).items()),
        "precision": sorted((precision or {}).items()),
        "bias": sorted((k, [float(x) for x in v]) for k, v in (bias or {}).items()),
        "frozen": spec.frozen_positions,
        "inputs": [(tuple(args[i].shape), str(args[i].dtype)) for i in spec.runtime_positions],
    }
    h.update(json.dumps(header, sort_keys=True, default=str).encode())
    h.update(spec.gm.code.encode())
    for pos in spec.frozen_positions:
        tensor = args[pos].detach()
        h.update(repr((tuple(tensor.shape), str(tensor.dtype))).encode())
        # Every byte: the earlier backend sampled large weights and served stale artifacts.
        h.update(tensor.contiguous().numpy().data)
    return h.hexdigest()


def export_weight_graph(spec: PartitionSpec, args: Sequence[torch.Tensor]):
    """Float ONNX of the partition with the frozen weights as graph inputs.

    aot_autograd may run the compiled graph's first call under a Python dispatch mode; the
    TorchScript tracer does not see through one and would constant-fold the whole partition
    (the graph inputs vanish). Export with the modes switched off.
    """
    with _disable_current_modes():
        names = [n.name for n in spec.gm.graph.nodes if n.op == "placeholder"]
        model = export_onnx(spec.gm, [a.detach() for a in args], names)
    model, _ = fold_batchnorm(model, spec.weight_names)
    return live_weights.split(model, spec.weight_names)


def weight_values(spec: PartitionSpec, args: Sequence[torch.Tensor]) -> dict:
    return {
        name: args[pos].detach().contiguous().numpy()
        for name, pos in zip(spec.weight_names, spec.frozen_positions, strict=True)
    }


def export_float(spec: PartitionSpec, args: Sequence[torch.Tensor]):
    """Float ONNX of the partition with the weights in `args` baked in (calibration's view)."""
    return live_weights.bake(export_weight_graph(spec, args), weight_values(spec, args))


def build(
    spec: PartitionSpec,
    args: Sequence[torch.Tensor],
    settings: BpuSettings,
    scales: dict[str, float] | None,
    need_hbm: bool,
    compile_artifact: bool,
    precision: dict[str, str] | None = None,
    bias: Mapping[str, Sequence[float]] | None = None,
) -> BuildResult:
    """Produce (or find) the artifact for `spec` with the weights in `args`.

    Stages: probe the compiler and key the graph; look the key up in the cache; convert (export,
    Q/DQ, live-weights graph); compile and store.
    """
    timings: dict[str, float] = {}
    start = time.perf_counter()
    info: CompilerInfo | None = (
        discover(driver=settings.driver) if (need_hbm or compile_artifact) else None
    )
    compiler_id = info.compiler_id if info is not None and info.kind != "none" else "none"
    want_compile = (need_hbm or compile_artifact) and compiler_id != "none"
    cache = ArtifactCache(settings.cache_dir) if settings.cache else None
    gkey = graph_key(spec, args, settings, scales, precision, bias)
    timings["graph_key_s"] = time.perf_counter() - start

    if cache is not None:
        art = _cached(cache, gkey, compiler_id, need_hbm, want_compile)
        if art is not None:
            timings["total_s"] = time.perf_counter() - start
            hbm = art.file("model.hbm")
            return BuildResult(
                art,
                (art.path / "model.onnx").read_bytes(),
                art.file(LIVE_MODEL).read_bytes(),
                gkey,
                True,
                False,
                False,
                art.meta.get("compiler_id", compiler_id),
                timings,
                str(hbm) if hbm else None,
            )

    onnx_bytes, live_bytes = _convert(spec, args, settings, scales, timings, precision, bias)
    if need_hbm and not want_compile:
        raise CompileError(
            f"partition {spec.index}: no cached .hbm artifact and no hbdk4 compiler "
            f"({info.detail if info else 'not probed'}). Fix: compile on an x86_64 host "
            "(`invoke compile-host`) and `invoke ship-cache`, or provision the emulated compiler"
        )
    job = _ArtifactJob(
        spec, settings, info, compiler_id, gkey, onnx_bytes, live_bytes, want_compile, timings
    )
    art, hbm_path = _store(cache, job)
    timings["total_s"] = time.perf_counter() - start
    result = BuildResult(
        art, onnx_bytes, live_bytes, gkey, False, True, job.compiled, compiler_id, timings, hbm_path
    )
    result.temporary = art is None and hbm_path is not None
    return result


def _cached(
    cache: ArtifactCache, gkey: str, compiler_id: str, need_hbm: bool, want_compile: bool
) -> Artifact | None:
    """The cached artifact of graph `gkey` this build may use, if any."""
    index = cache.index_lookup(gkey)
    candidates = [index[compiler_id]] if compiler_id in index else []
    if need_hbm and not want_compile:
        # On a board without a compiler: any compiler's artifact for this march will do
        # (that is how a cache compiled on an x86 host is used).
        candidates += [k for c, k in sorted(index.items()) if c != "none"]
    for key in candidates:
        art = _owned_artifact(cache, key, gkey, need_hbm)
        if art is not None:
            return art
    return None


def _convert(
    spec: PartitionSpec,
    args: Sequence[torch.Tensor],
    settings: BpuSettings,
    scales: dict[str, float] | None,
    timings: dict[str, float],
    precision: dict[str, str] | None = None,
    bias: Mapping[str, Sequence[float]] | None = None,
) -> tuple[bytes, bytes]:
    """The canonical bytes of the (quantized) ONNX model and of its live-weights graph; `bias`
    (bias correction: bias tensor -> delta) is added to those biases before quantization."""
    t0 = time.perf_counter()
    weight_graph = export_weight_graph(spec, args)
    baked = live_weights.bake(weight_graph, weight_values(spec, args))
    timings["export_s"] = time.perf_counter() - t0
    model = baked
    deltas = {k: np.asarray(v, np.float32) for k, v in (bias or {}).items()}
    if settings.quantize:
        t0 = time.perf_counter()
        corrected = add_to_biases(baked, deltas) if deltas else baked
        model = quantize_model(corrected, scales or {}, settings.act_scale, precision)
        timings["qdq_s"] = time.perf_counter() - t0
    else:
        deltas = {}
    onnx_bytes = canonical_bytes(model)
    # the live graph quantizes its bias with the same activation scales as the Q/DQ pass
    base = add_to_biases(baked, deltas) if deltas else baked
    live_scales = effective_scales(base, scales or {}, settings.act_scale)
    live = live_weights.make_live(
        weight_graph, baked, model, live_scales, settings.act_scale, deltas, precision
    )
    return onnx_bytes, canonical_bytes(live)


@dataclass
class _ArtifactJob:
    """One artifact to write: its models, its manifest metadata, and whether to run hbdk4."""

    spec: PartitionSpec
    settings: BpuSettings
    info: CompilerInfo | None
    compiler_id: str
    gkey: str
    onnx_bytes: bytes
    live_bytes: bytes
    want_compile: bool
    timings: dict[str, float]
    compiled: bool = False
    onnx_sha256: str = field(init=False)
    key: str = field(init=False)

    def __post_init__(self) -> None:
        self.onnx_sha256 = hashlib.sha256(self.onnx_bytes).hexdigest()
        march, compiler_id = self.settings.march, self.compiler_id
        self.key = artifact_key(self.onnx_sha256, march, compiler_id, PIPELINE_VERSION, self.gkey)

    def make(self) -> tuple[dict[str, bytes], dict]:
        """The artifact's files and metadata (runs hbdk4 when asked to)."""
        settings = self.settings
        files = {"model.onnx": self.onnx_bytes, LIVE_MODEL: self.live_bytes}
        meta = {
            "march": settings.march,
            "compiler_id": self.compiler_id,
            "pipeline": PIPELINE_VERSION,
            "graph_key": self.gkey,
            "onnx_sha256": self.onnx_sha256,
            "fingerprint": self.spec.fingerprint,
            "input_names": list(self.spec.input_names),
            "output_names": self.spec.output_names,
            "quantized": settings.quantize,
        }
        if self.want_compile:
            t1 = time.perf_counter()
            hbm, result = compile_onnx(
                self.onnx_bytes,
                self.info,
                settings.march,
                settings.opt_level,
                settings.compile_timeout,
            )
            self.timings["compile_s"] = time.perf_counter() - t1
            files["model.hbm"] = hbm
            meta["compiler_result"] = {k: v for k, v in result.items() if k != "traceback"}
            self.compiled = True
        return files, meta


def _store(cache: ArtifactCache | None, job: _ArtifactJob) -> tuple[Artifact | None, str | None]:
    """Build the artifact into the cache (or, without one, the .hbm into a temporary dir)."""
    if cache is not None:
        art, _ = cache.get_or_build(job.key, job.make)
        cache.index_record(job.gkey, job.compiler_id, job.key)
        hbm = art.file("model.hbm")
        return art, str(hbm) if hbm else None
    files, _meta = job.make()
    if "model.hbm" not in files:
        return None, None
    # The executor loads it at construction and the caller removes the directory then
    # (BuildResult.temporary), so uncached builds leave nothing behind.
    tmp = Path(tempfile.mkdtemp(prefix="torch-fl-bpu-")) / "model.hbm"
    tmp.write_bytes(files["model.hbm"])
    return None, str(tmp)


REQUIRED_FILES = ("model.onnx", LIVE_MODEL)


def _owned_artifact(cache: ArtifactCache, key: str, gkey: str, need_hbm: bool):
    """The cached artifact `key` if it proves it was built for graph `gkey`, else None.

    The index only suggests keys; the artifact's manifest must record this graph key and the
    digest of its model.onnx, and the key must be the hash of exactly those, so an index entry
    pointing at another graph's artifact is never run.
    """
    art = cache.get(key)
    if art is None:
        return None
    meta = art.meta
    missing = [name for name in REQUIRED_FILES if art.file(name) is None]
    if missing:
        cache._discard(art.path, f"artifact lacks {', '.join(missing)}")
        return None
    digest = meta["files"]["model.onnx"]["sha256"]
    fields = [meta.get(k) for k in ("march", "compiler_id", "pipeline")]
    expected = (
        artifact_key(digest, *fields, gkey) if all(isinstance(f, str) for f in fields) else None
    )
    if meta.get("graph_key") != gkey or meta.get("onnx_sha256") != digest or expected != key:
        warnings.warn(
            f"torch_fl.bpu cache: index entry for graph {gkey[:16]}... points at {art.path}, "
            f"which belongs to graph {str(meta.get('graph_key'))[:16]}...; ignored, will rebuild",
            RuntimeWarning,
            stacklevel=4,
        )
        return None
    if need_hbm and art.file("model.hbm") is None:
        return None
    return art

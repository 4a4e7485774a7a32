"""The three ways a partition runs: hbm (the board), sim (int8 numerics on the host), eager.

Each executor takes all of the partition's inputs, in the order of its placeholders, and
returns a tuple of tensors (`Executor`). The sim executor reads the weights among them live; the
hbm executor picks the runtime inputs (its artifact holds the weights). Everything that can be
computed once (names, dtypes, the ORT session) is computed in the constructor: the call path only
converts. Which one runs is chosen in registry.py.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import importlib.util
import os
import warnings
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import onnx
import torch

from torch_fl.bpu.conversion.integer_form import to_integer_form
from torch_fl.bpu.conversion.narrow_convs import rewrite_narrow_convs
from torch_fl.bpu.conversion.narrow_op import MAX_OUTPUTS_BY_FORM
from torch_fl.bpu.conversion.session_graph import session_graph
from torch_fl.bpu.errors import ArtifactError
from torch_fl.bpu.runtime import sim_threads
from torch_fl.bpu.runtime.sim_kernels import KernelChoice
from torch_fl.host_view import cpu_views, to_device

UNFUSED = ("SkipLayerNormFusion", "ConvMulFusion")
"""ONNX Runtime graph fusions the sim's integer session runs without: SkipLayerNormalization
(measured slower, below), and the folding of a constant Mul into a float Conv's weights, which
would break the exactness of the narrow convs' float form (conversion/narrow_convs.py)."""


def fused_graph(
    onnx_bytes: bytes, path: str, float_narrow: bool = True
) -> tuple[onnx.ModelProto, int]:
    """The graph the sim's integer session runs for kernel path `path`: the integer form, with
    its narrow convs as exact float convs where `float_narrow` (not where the extension's
    NarrowConv op takes them: conversion/narrow_op.py); and how many of those."""
    model = to_integer_form(onnx.load_from_string(onnx_bytes), path)
    return model, rewrite_narrow_convs(model) if float_narrow else 0


LOOKUP_MIN_ORT = (1, 17)
"""The oldest ONNX Runtime with the custom-op interface the lookup ops use (csrc/runtime/ort_abi.h)."""


@functools.cache
def lookup_library() -> str | None:
    """The shared library holding the lookup ops (this extension's own), or None where this
    ONNX Runtime is too old to load them."""
    import onnxruntime as ort

    from torch_fl import _C

    version = tuple(int(p) for p in ort.__version__.split(".")[:2] if p.isdigit())
    return _C.__file__ if version >= LOOKUP_MIN_ORT else None


def depthwise_kernel() -> str:
    """Which form the extension's DepthwiseConv op runs here: "avx512", "avx2" or "portable"
    (csrc/runtime/ort_depthwise.cpp). The sim uses the op only in a vector form, and its
    GroupedConv op only in the AVX-512 one (the group shapes it takes are laid out for 16 lanes:
    conversion/grouped_conv.py); the plain loop is exact but no faster than ORT's own kernel
    (conversion/depthwise.py)."""
    from torch_fl import _C

    return _C._depthwise_kernel()


def narrow_kernel() -> str:
    """Which form the extension's NarrowConv op runs here: "vnni", "avx2" or "portable"
    (csrc/runtime/ort_narrow.cpp). The sim uses the op only in a vector form (up to
    conversion/narrow_op.MAX_OUTPUTS_BY_FORM outputs); elsewhere the narrow convs' exact float
    form (conversion/narrow_convs.py) is the faster. The grouped and one-row ops' VNNI forms
    are asked for by "vnni" alone."""
    from torch_fl import _C

    return _C._narrow_kernel()


def pair_gemm_kernel() -> str:
    """Which form the extension's PairGemm op runs here: "avx2" or "portable"
    (csrc/runtime/ort_pair_gemm.cpp)."""
    from torch_fl import _C

    return _C._pair_gemm_kernel()


def takes_pair_gemms(path: str) -> bool:
    """Whether the sim runs its 1x1 convs and GEMMs with uint8 weights on the PairGemm op, for
    the kernel path `path` (runtime/sim_kernels.py): only on ORT's u8u8 kernels (elsewhere they
    are u8s8 ones with int32 dot products, faster), and only where the op's AVX2 form meets
    ORT's AVX2 ones: on an AVX-512 CPU ORT's u8u8 kernels are wider and beat it (the op ran at
    0.71 to 0.99 of their speed there: scripts/bench_conv_ops.py on this project's host)."""
    return (
        path in ("mixed", "u8u8")
        and pair_gemm_kernel() == "avx2"
        and depthwise_kernel() != "avx512"
    )


SPIN_STOP = "session.force_spinning_stop"
"""ORT's session option that stops a pool's threads spinning when a run ends. By default they
spin on for tens of ms after it, waiting for the next run of their own session; where the next
run is another partition's session, its threads and the spinning ones share the CPUs. By hand
(MobileNetV3-Small's sim session at batch 1 as two partitions' stand-in, 2 threads, the 2-vCPU
Xeon with AMX; medians of 30 blocks of ten): two sessions run in turn took 5.83 ms a pair
without it and 2.63 with it, one alone 1.30 ms; one session run back to back lost 3 % with it
(1.47 against 1.42 ms), so a graph of one partition keeps ORT's spin."""


class Executor(Protocol):
    """Runs one partition: every partition input in, the partition's outputs out."""

    kind: str

    def __call__(self, args: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]: ...


class EagerExecutor:
    """The partition's own FX graph on the CPU: bit-exact, and the fallback of the others."""

    kind = "eager"

    def __init__(self, gm: torch.nn.Module) -> None:
        self.gm = gm

    def __call__(self, args: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return self.gm(*args)


class SimExecutor:
    """ONNX Runtime on the Q/DQ graph: the BPU's int8 numerics on the host.

    With baked weights (sim_weights="checked", the default) the graph holds its int8 weights and
    runs on the fused integer kernels of `kernels` (runtime/sim_kernels.py); the partition runtime
    checks the weights before each call. With `weights` (sim_weights="live") the graph reads the
    frozen weights as inputs (conversion/live_weights.py): every call runs the weights the
    parameters hold at that moment. Their numpy views are made once and reused while each
    parameter's data pointer is unchanged; a view keeps its storage alive, so an equal pointer
    means the same memory, and shape, stride or dtype changes are recompiled by Dynamo's guards
    before they reach this call.
    """

    kind = "sim"

    def __init__(
        self,
        onnx_bytes: bytes,
        threads: int = 0,
        runtime_inputs: Sequence[tuple[str, int]] = (),
        weights: Sequence[tuple[str, int]] = (),
        kernels: KernelChoice | None = None,
        thread_candidates: Sequence[int] = (),
        lookups: bool = True,
        depthwise: bool = True,
        narrow: bool = True,
        pair_gemm: bool = True,
        stop_spinning: bool = False,
    ) -> None:
        """`kernels`: the path of runtime/sim_kernels.py (None: float Q/DQ). `threads`: the ORT
        intra-op threads the session opens with (0: ORT's default); `thread_candidates`: the
        counts `time_threads` measures (runtime/sim_threads.py; empty: `threads` is final).
        `lookups`: the fused graph's elementwise chains as table lookups (conversion/lookups.py)
        where this ONNX Runtime can load the lookup ops; `depthwise`: its depthwise int8 convs
        as the extension's DepthwiseConv op (conversion/depthwise.py), its grouped convs of
        narrow groups as GroupedConv or GroupedDotConv (conversion/grouped_conv.py), where those
        ops have a vector form here (DepthwiseConv: AVX-512 or AVX2; GroupedConv: AVX-512;
        GroupedDotConv: AVX512-VNNI); `narrow`: its convs over few input channels as the
        NarrowConv op (conversion/narrow_op.py) where that op has a vector form here (VNNI or
        AVX2), else as exact float convs (conversion/narrow_convs.py); `pair_gemm`: where the
        kernels are ORT's u8u8 ones, its 1x1 convs and GEMMs with uint8 weights as the PairGemm
        op (conversion/pair_gemm.py), where that op has its AVX2 form. `stop_spinning`: the
        session's pool threads stop spinning at the end of each run (`SPIN_STOP`): set where the
        compiled graph runs other partitions, whose sessions each have a pool of their own."""
        self.kernels = kernels or KernelChoice("float", "float Q/DQ")
        self.threads = threads
        self.thread_candidates = tuple(thread_candidates)
        self.stop_spinning = stop_spinning
        self._trial: dict = {}
        self.lookups = 0
        """How many elementwise chains the session runs as table lookups."""
        self.narrow_convs = 0
        """How many narrow integer convs the session runs as exact float convs."""
        self.depthwise = 0
        """How many depthwise int8 convs the session runs on the extension's op."""
        self.grouped = 0
        """How many grouped int8 convs of narrow groups the session runs on the extension's op."""
        self.pools = 0
        """How many channels-first 8-bit max pools the session runs on the extension's op."""
        self.concats = 0
        """How many 8-bit concats the session runs on the extension's op."""
        self.gemv = 0
        """How many one-row 8-bit GEMMs the session runs on the extension's op."""
        self.narrow_ops = 0
        """How many narrow int8 convs the session runs on the extension's op."""
        self.pair_gemms = 0
        """How many 1x1 int8 convs and GEMMs the session runs on the extension's PairGemm op."""
        self.lookup_means = 0
        """How many of the lookups run with the mean over them as one op."""
        self.folded_clamps = 0
        """How many of the lookups (byte clamps) run inside the output step of the op they
        read (conversion/clamp_fold.py)."""
        self.float_narrow = True
        """Whether the fused graph has the narrow convs' float form (not where the op takes
        them)."""
        if self.kernels.path != "float":
            try:
                # the integer form ORT fuses into QLinearConv/QGemm/...; the path was probed
                # exact on this CPU
                ops = lookup_library() is not None
                fast_narrow = ops and narrow and narrow_kernel() != "portable"
                self.float_narrow = not fast_narrow
                model, self.narrow_convs = fused_graph(
                    onnx_bytes, self.kernels.path, self.float_narrow
                )
                if ops:
                    form = depthwise_kernel()
                    fast_depthwise = depthwise and form != "portable"
                    dot = depthwise and narrow_kernel() == "vnni"  # AVX512-VNNI's grouped convs
                    pairs = pair_gemm and takes_pair_gemms(self.kernels.path)
                    # the pool op's plain loop beats ORT's channels-first byte pool too
                    self._open_rewritten(
                        model, lookups, fast_depthwise, fast_narrow, dot, pools=depthwise,
                        grouped=depthwise and form == "avx512",
                        narrow_outputs=MAX_OUTPUTS_BY_FORM.get(narrow_kernel(), 0),
                        pair_gemm=pairs,
                    )  # fmt: skip
                if not self._rewritten():
                    self._open_session(model.SerializeToString(), fused=True)
            except Exception as exc:  # noqa: BLE001  (any rejection: the float path is exact)
                self.narrow_convs = 0
                self._no_extension_ops()
                why = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
                self.kernels = KernelChoice(
                    "float", f"{self.kernels.path} form rejected ({type(exc).__name__}: {why})"
                )
                warnings.warn(
                    f"torch_fl.bpu: sim: the {kernels.path} integer kernels could not run this "
                    f"partition ({type(exc).__name__}: {why}); it runs with float Q/DQ (the same "
                    "int8 numbers, slower)",
                    stacklevel=2,
                )
        if self.kernels.path == "float":
            self._open_session(onnx_bytes, fused=False)
        self.input_names = tuple(i.name for i in self.session.get_inputs())
        self.output_names = [o.name for o in self.session.get_outputs()]
        known = set(self.input_names)
        self._inputs = tuple((n, p) for n, p in runtime_inputs if n in known)
        self._weights = tuple((n, p) for n, p in weights if n in known)
        missing = known - {n for n, _ in self._inputs} - {n for n, _ in self._weights}
        if missing:
            raise ArtifactError(f"sim graph inputs {sorted(missing)} match no partition input")
        self._views: tuple[tuple[int, ...], dict] = ((), {})
        self._run = self.session.run

    def _no_extension_ops(self) -> None:
        """The session runs none of the extension's ops: every count `_rewritten` adds is 0."""
        self.lookups = self.depthwise = self.grouped = self.narrow_ops = self.pools = 0
        self.lookup_means = self.concats = self.gemv = self.pair_gemms = self.folded_clamps = 0

    def _rewritten(self) -> int:
        """How many of the fused graph's nodes run on the extension's ops."""
        return (
            self.lookups + self.depthwise + self.grouped + self.narrow_ops + self.pools
            + self.concats + self.gemv + self.pair_gemms
        )  # fmt: skip

    def _open_rewritten(
        self,
        model: onnx.ModelProto,
        lookups: bool,
        depthwise: bool,
        narrow: bool,
        dot: bool,
        pools: bool = False,
        grouped: bool = False,
        narrow_outputs: int = 0,
        pair_gemm: bool = False,
    ) -> None:
        """Open the session on ORT's optimized form of the fused graph `model` with the
        extension's ops in it (conversion/session_graph.py); where it has nothing to replace or
        that fails, `self.lookups`, `self.depthwise`, `self.grouped`, `self.narrow_ops`,
        `self.pools` and `self.concats` stay 0 and ORT's own ops run it all (the same numbers)."""
        try:
            graph = session_graph(
                model, UNFUSED, lookups, depthwise, narrow, dot, pools, grouped=grouped,
                narrow_outputs=narrow_outputs, pair_gemm=pair_gemm,
            )  # fmt: skip
            if graph.data is not None:
                self.lookups, self.depthwise = graph.lookups, graph.depthwise
                self.narrow_ops, self.lookup_means = graph.narrow, graph.means
                self.grouped, self.pools = graph.grouped, graph.pools
                self.concats, self.gemv = graph.concats, graph.gemv
                self.pair_gemms, self.folded_clamps = graph.pair_gemms, graph.clamps
                self._open_session(graph.data, fused=True)
        except Exception as exc:  # noqa: BLE001  (any failure: ORT's own ops run the graph)
            self._no_extension_ops()
            warnings.warn(
                "torch_fl.bpu: sim: the extension's lookup / depthwise / grouped / narrow / pool / "
                "concat ops could not run this partition "
                f"({type(exc).__name__}: {str(exc).strip()[:160]}); "
                "ONNX Runtime's own ops run it (the same numbers, slower)",
                stacklevel=3,
            )

    def _weight_feed(self, args: Sequence[torch.Tensor]) -> dict:
        ptrs, feed = self._views
        if ptrs:
            for (_, pos), ptr in zip(self._weights, ptrs, strict=True):
                if args[pos].data_ptr() != ptr:
                    break
            else:
                return feed
        # First call, or a parameter now points at other memory (`p.data = ...`).
        feed = {name: args[pos].detach().numpy() for name, pos in self._weights}
        self._views = (tuple(args[pos].data_ptr() for _, pos in self._weights), feed)
        return feed

    def _open_session(self, onnx_bytes: bytes, fused: bool) -> None:
        self._bytes, self._fused = onnx_bytes, fused
        self.session = self._new_session(self.threads)
        self._pid = os.getpid()

    def _new_session(self, threads: int):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3
        if not self._fused:
            # Q/DQ as explicit rounding steps around float kernels: ORT must not fuse them into
            # integer kernels that may saturate on this CPU (sim_kernels.py).
            options.add_session_config_entry("session.disable_quant_qdq", "1")
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        if self.stop_spinning and threads != 1:
            options.add_session_config_entry(SPIN_STOP, "1")
        if self._fused and self._rewritten():
            # an ORT-optimized graph with the extension's ops in it: optimizing it again would
            # only wrap them in transposes (conversion/session_graph.py)
            options.register_custom_ops_library(lookup_library())
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        # ORT's SkipLayerNormalization kernel (the fusion of Add + LayerNormalization) is slower
        # here than the two ops it replaces: the 4-layer encoder's fused sim session ran 6.72 ms
        # with it and 5.48 ms without (1 thread, AVX512-VNNI EPYC; the same float math)
        disabled = list(UNFUSED) if self._fused else []
        return ort.InferenceSession(
            self._bytes, options, ["CPUExecutionProvider"], disabled_optimizers=disabled
        )

    def time_threads(self, args: Sequence[torch.Tensor]) -> dict[int, float]:
        """Median seconds per run of this partition's session on `args` at each of
        `thread_candidates` (sim_threads.measure); `use_threads` then keeps one."""
        feed = self._feed(args)
        self._trial = {
            n: self.session if n == self.threads else self._new_session(n)
            for n in self.thread_candidates
        }
        names = self.output_names
        return sim_threads.measure(
            {n: (lambda s=s: s.run(names, feed)) for n, s in self._trial.items()}
        )

    def use_threads(self, threads: int, keep: Sequence[int] = ()) -> None:
        """Run on `threads` ORT threads from now on. The trial sessions of the counts in `keep`
        stay open for `switch_threads` (the choice confirmed on later calls,
        sim_threads.Confirmation); the others are dropped."""
        trial = self._trial
        session = trial.get(threads)
        self.session = session if session is not None else self._new_session(threads)
        self._trial = {n: s for n, s in trial.items() if n in keep}
        if self._trial:
            self._trial[threads] = self.session
        self.threads = threads
        self._run = self.session.run

    def switch_threads(self, threads: int) -> None:
        """Run on the kept trial session of `threads` (see `use_threads`)."""
        self.session = self._trial[threads]
        self.threads = threads
        self._run = self.session.run

    def _reopen_after_fork(self) -> None:
        """ORT sessions do not survive fork: their thread pools stay in the parent, and
        destroying one in the child joins threads that are not there (a deadlock). The child
        keeps the parent's session object forever and opens its own."""
        _keep_forever(self.session)
        for session in self._trial.values():
            _keep_forever(session)
        self._trial = {}
        self.session = self._new_session(self.threads)
        self._run = self.session.run
        self._pid = os.getpid()

    def __del__(self) -> None:
        try:
            if self._pid != os.getpid():
                _keep_forever(self.session)
                for session in self._trial.values():
                    _keep_forever(session)
        except (AttributeError, TypeError):
            pass  # a half-built executor, or interpreter shutdown (modules already cleared)

    def __call__(self, args: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        if os.getpid() != self._pid:
            self._reopen_after_fork()
        return tuple(map(torch.from_numpy, self._run(self.output_names, self._feed(args))))

    def _feed(self, args: Sequence[torch.Tensor]) -> dict:
        # live weights come first (a copy: the cached dict is reused); baked ones feed nothing
        feed = dict(self._weight_feed(args)) if self._weights else {}
        for name, pos in self._inputs:
            feed[name] = host_array(args[pos])
        return feed


def host_array(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor's memory. `detach()` only where the tensor requires grad:
    it is a dispatcher call, and after an int8 session has emptied the caches it took 38 us of
    a call where `numpy()` alone took 24 (MobileNetV3's input at batch 1, medians of 100)."""
    try:
        return tensor.numpy()
    except RuntimeError:  # requires grad (or another case numpy() refuses: detach() says which)
        return tensor.detach().numpy()


class OnDevice:
    """An executor for partitions whose tensors live on `flagos`: the inner executor reads
    zero-copy CPU views of them, and its outputs come back on the inputs' device."""

    def __init__(self, inner: Executor, device: torch.device) -> None:
        self.inner = inner
        self.device = device
        self.kernels = getattr(inner, "kernels", None)

    def __call__(self, args: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        outs = self.inner(cpu_views(args))
        return tuple(to_device(o, self.device) for o in outs)


def _keep_forever(obj: object) -> None:
    """One reference that is never dropped: `obj` is never destroyed in this process."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


_NP_DTYPES = {
    "float32": np.float32,
    "float16": np.float16,
    "int8": np.int8,
    "int16": np.int16,
    "int32": np.int32,
    "uint8": np.uint8,
}


def _meta(runtime, attr: str, model: str):
    value = getattr(runtime, attr, None)
    if isinstance(value, dict):
        value = value.get(model)
    return value


class HbmExecutor:
    """The board runtime (`hbm_runtime.HB_HBMRuntime`), inputs/outputs matched by name.

    hbm_runtime is imported when an executor is built, never at module import, so this module
    loads on any host. Inputs whose dtype already matches the model's are handed over as numpy
    views of the tensor (no copy); quantized int inputs/outputs are (de)quantized with the
    scale/zero point the model reports.
    """

    kind = "hbm"

    def __init__(
        self,
        hbm_path: str,
        input_names: Sequence[str],
        output_names: Sequence[str],
        positions: Sequence[int],
    ) -> None:
        """`positions`: where each of `input_names` sits among the partition's inputs."""
        self.positions = tuple(positions)
        module = importlib.import_module("hbm_runtime")
        self.runtime = module.HB_HBMRuntime(str(hbm_path))
        names = list(getattr(self.runtime, "model_names", None) or [])
        if len(names) != 1:
            raise ArtifactError(
                f"{hbm_path}: expected one model in the artifact, found {names or 'none'}; "
                "delete the cache entry (invoke cache.clean) and recompile"
            )
        self.model = names[0]
        have_in = list(_meta(self.runtime, "input_names", self.model) or [])
        have_out = list(_meta(self.runtime, "output_names", self.model) or [])
        missing = [n for n in input_names if n not in have_in]
        missing += [n for n in output_names if n not in have_out]
        if missing:
            raise ArtifactError(
                f"{hbm_path}: tensors {missing} not in the artifact (inputs {have_in}, outputs "
                f"{have_out}); the artifact does not belong to this partition. Fix: "
                "`invoke cache.clean` and recompile"
            )
        dtypes = _meta(self.runtime, "input_dtypes", self.model) or {}
        quants = _meta(self.runtime, "input_quants", self.model) or {}
        out_quants = _meta(self.runtime, "output_quants", self.model) or {}
        self.inputs = []
        for name in input_names:
            dtype = np.dtype(_NP_DTYPES.get(str(dtypes.get(name, "float32")), np.float32))
            self.inputs.append((name, dtype, quants.get(name)))
        self.outputs = [(name, out_quants.get(name)) for name in output_names]
        self._run = self.runtime.run

    def __call__(self, args: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        feed = {}
        inputs = [args[i] for i in self.positions]
        for (name, dtype, quant), t in zip(self.inputs, inputs, strict=False):
            array = t.detach().numpy()
            if array.dtype != dtype:
                if quant is not None:
                    scale, zero = quant["scale"], quant.get("zero_point", 0)
                    info = np.iinfo(dtype)
                    array = np.clip(np.rint(array / scale) + zero, info.min, info.max)
                array = array.astype(dtype)
            feed[name] = array  # same dtype: a view of the tensor's memory, no copy
        result = self._run(feed)[self.model]
        outs = []
        for name, quant in self.outputs:
            array = result[name]
            if quant is not None:
                array = (array.astype(np.float32) - quant.get("zero_point", 0)) * quant["scale"]
            outs.append(torch.from_numpy(np.asarray(array)))
        return tuple(outs)


def hbm_runtime_available() -> bool:
    return importlib.util.find_spec("hbm_runtime") is not None

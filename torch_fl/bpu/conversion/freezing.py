"""Change detection for weights baked into what runs: the `.hbm` artifact, and the sim
executor's int8 session (whose weights are pre-packed for the integer kernels).

Version counters alone miss writes through `.data`, `p.data = ...` and numpy views, so each call
checks, per weight: identity (same tensor object, data pointer, storage size, strides, version
counter) and then content: a 128-bit fingerprint of the weight's bytes, compared with the one
taken when the weights were baked. One pass reading the weights once, at memory speed (ResNet-18's
46.8 MB: measured by scripts/bench_compile.py), and no private copy of the weights. A change that
leaves the fingerprint equal is about a 2^-64 event for any change not built to collide (one
changed 8-byte word is always seen by the extension's fingerprint, below);
`sim_weights="live"` (quantize in the graph on every call) rules out even that, at float speed.

Where the weights are large (>= OVERLAP_BYTES) and a CPU is free beside the executor's own (sim
with fewer ORT threads than CPUs, or the board's BPU), the check runs on a checker thread while
the partition runs, and the caller waits for both before returning:
a changed weight still discards the result and rebuilds, but the check no longer adds its
memory-bound pass to the latency (the partition's executor reads only its own baked copy).

The checker thread hashes with the extension's own 128-bit fingerprint (csrc/runtime/
fingerprint.cpp), all weights in one call that releases the GIL: python-xxhash holds the GIL for
every input under 64 KB, and MobileNetV3's 210 weights, most of them small, kept the caller's
Python waiting behind it (timed in place, batch 1, 1 ORT thread, 2-core EPYC: 3.50 ms a call
with XXH3 beside the call, 2.90 ms with the GIL-free pass, 2.76 ms with no check at all). It
hashes on every CPU the executor leaves (whole weights to threads): the board's BPU leaves all
but the caller's, and the portable pass the boards run is the slow one (19 GB/s here, against
43-65 for the AVX-512 form). Before the call (no CPU free beside the executor), the pass is
whichever was faster when first timed: XXH3 in one thread (it wins on weights in cache and on
CPUs without AVX-512) or the extension's on every CPU. Both fingerprints are taken at build time,
and explain() shows where, how and on how many CPUs each partition's check runs.
"""

from __future__ import annotations

import operator
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from torch_fl import _C
from torch_fl.bpu.errors import ExecutorUnavailableError
from torch_fl.bpu.settings import usable_cpus as _usable_cpus
from torch_fl.host_view import cpu_view


def _hasher():
    try:
        import xxhash
    except ImportError as exc:  # a dependency of torch_fl (pyproject.toml); say how to get it
        raise ExecutorUnavailableError(
            "checking baked weights needs the xxhash module, which is not importable. Fix: "
            "`pip install xxhash` (a torch_fl dependency), or options={'sim_weights': 'live'}"
        ) from exc
    return xxhash.xxh3_128_intdigest


OVERLAP_BYTES = 1 << 20
_pool: tuple[int, ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()


def _checker() -> ThreadPoolExecutor:
    """The process's one checker thread (a new one in a forked child: threads do not fork)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="bpu-weight-check"))
        return _pool[1]


def _byte_view(tensor: torch.Tensor):
    """A uint8 numpy view of a dense tensor's memory (no copy); None if it has gaps or is empty.

    The view holds the storage alive, so while the tensor keeps this data pointer, the view
    reads exactly the bytes the tensor holds."""
    dense = cpu_view(tensor)  # a flagos weight: a view of its host-mapped memory
    if not dense.is_contiguous() or dense.numel() == 0:
        return None
    return dense.reshape(-1).view(torch.uint8).numpy()


def _byte_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A uint8 CPU tensor view of a dense tensor's memory (no copy), for the extension's hash."""
    return cpu_view(tensor).detach().reshape(-1).view(torch.uint8)


def fingerprint(tensor: torch.Tensor, digest=None) -> int:
    """XXH3-128 of the tensor's bytes in row-major order (a dense copy first if it has gaps)."""
    digest = digest or _hasher()
    view = _byte_view(tensor)
    if view is None:
        dense = cpu_view(tensor).detach().contiguous()
        if dense.numel() == 0:
            return digest(b"")
        view = dense.reshape(-1).view(torch.uint8).numpy()
    return digest(view)


_data_ptr = torch.Tensor.data_ptr
_version = operator.attrgetter("_version")
_stride = torch.Tensor.stride


def _storage_sizes(tensors: Sequence[torch.Tensor]) -> list[int]:
    return list(map(torch.UntypedStorage.nbytes, map(torch.Tensor.untyped_storage, tensors)))


def _picker(positions: tuple[int, ...]) -> Callable[[Sequence], tuple]:
    """args -> the tuple of args at `positions` (itemgetter, which returns a bare item for one
    position and cannot take none)."""
    if len(positions) > 1:
        return operator.itemgetter(*positions)
    if positions:
        only = positions[0]
        return lambda args: (args[only],)
    return lambda args: ()


class FrozenWeights:
    """The weights one build of a partition baked in, to detect any later change.

    Held column-wise, so that a call's check walks them in C (`map` over the columns, then
    one list comparison each) rather than in a Python loop per weight: for 210 small weights
    a check took 173 us that way and 254 us with the loop (2-vCPU EPYC, timed by hand). For
    real weights the XXH3 pass over their bytes dominates (docs/compile-models.md)."""

    __slots__ = (
        "_pick",
        "_tensors",
        "_ptrs",
        "_storage_nbytes",
        "_versions",
        "_strides",
        "_dense",
        "_native",
        "_gapped",
        "_digest",
        "_nbytes",
        "overlap",
        "_beside_threads",
        "_inline_threads",
        "_inline_pass",
        "_inline_times",
    )

    def __init__(
        self, positions: Sequence[int], args: Sequence[torch.Tensor], busy_cpus: int = 1
    ) -> None:
        """`busy_cpus`: how many CPUs the partition's own executor keeps busy while it runs (the
        check overlaps it only where one more is free; otherwise both would share a core and
        the overlap would only add switching)."""
        self._digest = digest = _hasher()
        positions = tuple(positions)
        self._pick = _picker(positions)
        tensors = self._pick(args)
        self._tensors = tensors
        self._ptrs = list(map(_data_ptr, tensors))
        self._storage_nbytes = _storage_sizes(tensors)
        self._versions = list(map(_version, tensors))
        self._strides = list(map(_stride, tensors))
        views = [_byte_view(t) for t in tensors]
        # dense weights: (their byte views, fingerprints), hashed in one map per call; a weight
        # with gaps is copied dense to be hashed (rare: a strided view passed as a weight)
        dense = [
            (v, fingerprint(t, digest))
            for t, v in zip(tensors, views, strict=True)
            if v is not None
        ]
        self._dense = ([v for v, _ in dense], [f for _, f in dense])
        # the same dense weights as torch byte views, with the GIL-free fingerprints the checker
        # thread compares
        native_views = tuple(
            _byte_tensor(t) for t, v in zip(tensors, views, strict=True) if v is not None
        )
        self._native = (native_views, _C._fingerprints(native_views))
        self._gapped = tuple(
            (i, fingerprint(t, digest))
            for i, (t, v) in enumerate(zip(tensors, views, strict=True))
            if v is None
        )
        self._nbytes = sum(t.numel() * t.element_size() for t in tensors)
        self.occupy(busy_cpus)
        # before the call every CPU is free: the check in the caller's thread may use them all
        self._inline_threads = max(_usable_cpus(), 1)
        # which pass the check before the call takes, timed when it is first needed: a check that
        # always runs beside the call (the board's BPU) never times it
        self._inline_pass: str | None = None
        self._inline_times: dict[str, float] | None = None

    def can_overlap(self, busy_cpus: int) -> bool:
        """Whether the check runs beside an executor that keeps `busy_cpus` CPUs busy."""
        return self._nbytes >= OVERLAP_BYTES and _usable_cpus() > max(busy_cpus, 1)

    def occupy(self, busy_cpus: int) -> None:
        """The executor keeps `busy_cpus` CPUs busy while it runs: check beside it where one is
        free, hashing on every CPU it leaves (the board's BPU leaves all but the caller's)."""
        self.overlap = self.can_overlap(busy_cpus)
        """Check beside the call (`check_in_background`) rather than before it."""
        self._beside_threads = max(_usable_cpus() - max(busy_cpus, 1), 1)

    @property
    def inline_pass(self) -> str:
        """ "xxh3" or "native": the pass the check before the call takes (timed on first use)."""
        if self._inline_pass is None:
            self._inline_pass, self._inline_times = self._pick_inline_pass()
        return self._inline_pass

    def _pick_inline_pass(self) -> tuple[str, dict[str, float] | None]:
        """Time both passes once (best of three, alternated) and keep the faster: XXH3 in one
        thread, or the extension's fingerprint on every CPU. Which wins depends on the CPU and
        the weights (2-vCPU EPYC with AVX-512, by hand: MobileNetV3's 9.7 MB 148 us against
        184 us, ResNet-18's 44.6 MB 1482 against 938 us; the portable form, which CPUs without
        AVX-512 run, lost on both and on ViT-S/16). The pass and the times (None: not timed)."""
        views, _ = self._native
        if self._nbytes < OVERLAP_BYTES or not views:
            return "xxh3", None
        dense = self._dense[0]
        digest, threads = self._digest, self._inline_threads
        passes = {
            "xxh3": lambda: list(map(digest, dense)),
            "native": lambda: _C._fingerprints(views, threads=threads),
        }
        best = dict.fromkeys(passes, float("inf"))
        for _ in range(3):
            for name, run in passes.items():
                start = time.perf_counter()
                run()
                best[name] = min(best[name], time.perf_counter() - start)
        return min(best, key=lambda name: (best[name], name != "xxh3")), best

    def describe(self) -> dict:
        """How a call checks these weights, for explain(): beside it or before it, on how many
        CPUs at most (the extension hashes whole weights, one thread a megabyte, 8 at most),
        with which pass (and the timing of both, where it chose)."""
        if self.overlap:
            return {"beside": True, "threads": self._beside_threads, "pass": "native"}
        native = self.inline_pass == "native"
        times = self._inline_times
        return {
            "beside": False,
            "threads": self._inline_threads if native else 1,
            "pass": self.inline_pass,
            "timed_us": {k: round(v * 1e6, 1) for k, v in times.items()} if times else None,
        }

    def check_in_background(self, args: Sequence[torch.Tensor]) -> Callable[[], bool]:
        """Start the check of `args` on the checker thread (`stale`, with the GIL-free
        fingerprint); the returned function waits for it."""
        return _checker().submit(self._stale_gil_free, tuple(args)).result

    def _stale_gil_free(self, args: Sequence[torch.Tensor]) -> bool:
        return self.stale(args, gil_free=True, threads=self._beside_threads)

    def stale(
        self, args: Sequence[torch.Tensor], gil_free: bool | None = None, threads: int | None = None
    ) -> bool:
        """Whether any baked weight among `args` changed: another tensor object, data pointer,
        version counter, strides or storage size, or other bytes: XXH3-128, or with `gil_free`
        the extension's fingerprint, hashed without holding the GIL on `threads` threads (None:
        every CPU); `gil_free=None` takes the pass timed on first use (`inline_pass`)."""
        current = self._pick(args)
        if (
            not all(map(operator.is_, current, self._tensors))
            or list(map(_data_ptr, current)) != self._ptrs
            or list(map(_version, current)) != self._versions
            or list(map(_stride, current)) != self._strides
            or _storage_sizes(current) != self._storage_nbytes
        ):
            return True
        # same objects, pointers and strides: the views made at build time read their bytes
        if gil_free is None:
            gil_free = self.inline_pass == "native"
        if gil_free:
            views, prints = self._native
            if _C._fingerprints(views, threads=threads or self._inline_threads) != prints:
                return True
        else:
            views, prints = self._dense
            if list(map(self._digest, views)) != prints:
                return True
        return any(fingerprint(current[i], self._digest) != p for i, p in self._gapped)

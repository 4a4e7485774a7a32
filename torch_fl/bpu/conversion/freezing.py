"""Change detection for weights baked into what runs: the `.hbm` artifact, and the sim
executor's int8 session (whose weights are pre-packed for the integer kernels).

Version counters alone miss writes through `.data`, `p.data = ...` and numpy views, so each call
checks, per weight: identity (same tensor object, data pointer, storage size, strides, version
counter; `_C._TensorIdentity`) and then content. Where Linux tracks writes for us (`watch`,
csrc/runtime/write_watch.h: userfaultfd's asynchronous write protection read by PAGEMAP_SCAN)
the content check hashes only the weights' bytes on the pages written since the last call (and
weights too small to be worth a page-table scan); otherwise, and for memory the tracking cannot see (shared, file-mapped,
pinned), a 128-bit fingerprint of the weight's bytes, compared with the one taken when the
weights were baked. One pass reading the weights once, at memory speed (ResNet-18's
46.8 MB: measured by scripts/bench_compile.py), and no private copy of the weights. A change that
leaves the fingerprint equal is about a 2^-64 event for any change not built to collide (one
changed 8-byte word is always seen by the extension's fingerprint, below);
`sim_weights="live"` (quantize in the graph on every call) rules out even that, at float speed.

Where the weights are large (>= OVERLAP_BYTES; with a write watch, where its check took
OVERLAP_CHECK_S or more when timed as the watch was armed) and a CPU is free beside the
executor's own (sim with fewer ORT threads than CPUs, or the board's BPU), the check runs on a
checker thread while the partition runs, and the caller waits for both before returning:
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
OVERLAP_CHECK_S = 40e-6
"""... or where, with a write watch, the check before the call took at least this long (timed
once when the watch is armed: the page-table scan costs more than its few hashed bytes say).
Handing the check to the checker thread costs the caller ~15 us (a submit, then a result that
is ready: 11 and 3 us, by hand). MobileNetV3's watched check took 69.5 us when its pages lay in
46 runs (one scan each) and gained beside the call (1.704 -> 1.539 ms a call at batch 1 on 1
thread); in 2 runs it takes ~20 us and is no slower before the call (2.392 against 2.556 ms, by
hand; docs/compile.md, *Only written pages are hashed*)."""
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


def _pinned(view: torch.Tensor) -> bool:
    """Page-locked for a device's DMA, which writes it without the CPU's page tables (a CUDA
    host's `pin_memory()`): its writes escape the kernel's write tracking."""
    try:
        return bool(view.is_pinned())
    except RuntimeError:  # no accelerator runtime to ask: nothing is pinned
        return False


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

    A call's check compares identities in the extension (`_C._TensorIdentity`: MobileNetV3's
    210 weights took 57 us a call as five Python maps over them, 3.2 us there; after 20 ms idle,
    with its objects out of the caches, 0.07 ms where one chain of misses per tensor took 0.18,
    by hand, at batch 1 on 2 ORT threads), then content: with a watch,
    the weights' bytes on the pages written since the last call; without, every byte."""

    __slots__ = (
        "_pick",
        "_tensors",
        "_identity",
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
        "_watch",
        "_watch_note",
        "_unwatched",
        "_hashed_nbytes",
        "_check_s",
    )

    def __init__(
        self,
        positions: Sequence[int],
        args: Sequence[torch.Tensor],
        busy_cpus: int = 1,
        watch: bool = False,
    ) -> None:
        """`busy_cpus`: how many CPUs the partition's own executor keeps busy while it runs (the
        check overlaps it only where one more is free; otherwise both would share a core and
        the overlap would only add switching). `watch`: have the kernel track writes to the
        weights' pages (`_arm_watch`), so that a call hashes only what was written."""
        self._digest = digest = _hasher()
        positions = tuple(positions)
        self._pick = _picker(positions)
        tensors = self._pick(args)
        self._tensors = tensors
        self._identity = _C._TensorIdentity(tensors)
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
        self._watch = None
        self._watch_note = "off (weight_watch=False)"
        self._unwatched: tuple[tuple[torch.Tensor, ...], bytes] | None = None
        self._hashed_nbytes = self._nbytes
        # before the call every CPU is free: the check in the caller's thread may use them all
        self._inline_threads = max(_usable_cpus(), 1)
        # which pass the check before the call takes, timed when it is first needed: a check that
        # always runs beside the call (the board's BPU) never times it
        self._inline_pass: str | None = None
        self._inline_times: dict[str, float] | None = None
        self._check_s: float | None = None
        if watch:
            self._arm_watch()
            if self._watch is not None and self._hashed_nbytes < OVERLAP_BYTES:
                self._check_s = self._time_check(args)
        self.occupy(busy_cpus)

    def _arm_watch(self) -> None:
        """Hand the dense weights' pages to the kernel's write tracking (csrc/runtime/
        write_watch.h): from here on a call hashes only the weights' bytes on the pages written
        since the last call (and weights too small to be worth a scan). Not for pinned memory (a device's DMA
        writes it without the CPU's page tables), nor where the kernel refuses (the note says
        why): those weights are hashed whole on every call, as without a watch."""
        views, prints = self._native
        pinned = [_pinned(v) for v in views]
        watched = [v for v, p in zip(views, pinned, strict=True) if not p]
        rest = tuple(v for v, p in zip(views, pinned, strict=True) if p)
        if not watched:
            self._watch_note = "nothing to watch (no dense weight in pageable memory)"
            return
        watch, why = _C._write_watch([(v.data_ptr(), v.nbytes) for v in watched])
        if watch is None:
            self._watch_note = f"unavailable: {why}"
            return
        # a weight written between the build's fingerprints and the protection is in the pages'
        # prints: compare the weights with the baked ones once more, now that writes count
        if _C._fingerprints(views) != prints:
            self._watch_note = "weights changed while the watch was armed: hashing them"
            return
        self._watch = watch
        self._unwatched = (rest, _C._fingerprints(rest)) if rest else None
        self._hashed_nbytes = self._watched_hashed_nbytes()
        self._watch_note = ""  # written when asked (`_watch_summary`): pages leave the watch

    def _watched_hashed_nbytes(self) -> int:
        """Bytes a watched check hashes on every call: the watch's own (runs too small to scan,
        pages that left it), the pinned weights and the gapped ones."""
        rest = self._unwatched[0] if self._unwatched is not None else ()
        return (
            self._watch.hashed_bytes
            + sum(v.nbytes for v in rest)
            + sum(self._tensors[i].nbytes for i, _ in self._gapped)
        )

    def _watch_summary(self) -> str:
        """The watch as it stands now, not as armed: a page written on three checks leaves it
        (csrc/runtime/write_watch.h), and its bytes are hashed on every call from then on."""
        watch = self._watch
        return (
            f"{watch.watched_bytes / 1e6:.1f} MB watched in {watch.runs} run(s), "
            f"{self._watched_hashed_nbytes() / 1e6:.2f} MB hashed on every call"
        )

    def _time_check(self, args: Sequence[torch.Tensor]) -> float:
        """Seconds of the watched check before the call: the best of three (each scans and
        re-protects the pages, as a call's check does)."""
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            self.stale(args)
            best = min(best, time.perf_counter() - start)
        return best

    def can_overlap(self, busy_cpus: int) -> bool:
        """Whether the check runs beside an executor that keeps `busy_cpus` CPUs busy: where it
        hashes a megabyte or more (with a watch: only the bytes it hashes on every call), or
        its watched check took `OVERLAP_CHECK_S` or more when timed."""
        costly = self._hashed_nbytes >= OVERLAP_BYTES or (
            self._check_s is not None and self._check_s >= OVERLAP_CHECK_S
        )
        return costly and _usable_cpus() > max(busy_cpus, 1)

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
        if self._watch is not None:
            timed = {"write-watch": round(self._check_s * 1e6, 1)} if self._check_s else None
            return {
                "beside": self.overlap,
                "threads": self._beside_threads if self.overlap else 1,
                "pass": "write-watch",
                "watch": self._watch_summary(),
                "timed_us": timed,
                "timed_when": "when armed",
            }
        # no watch: its note says why (off, refused by the kernel, dropped after a fork)
        if self.overlap:
            return {
                "beside": True,
                "threads": self._beside_threads,
                "pass": "native",
                "watch": self._watch_note,
            }
        native = self.inline_pass == "native"
        times = self._inline_times
        return {
            "beside": False,
            "threads": self._inline_threads if native else 1,
            "pass": self.inline_pass,
            "timed_us": {k: round(v * 1e6, 1) for k, v in times.items()} if times else None,
            "watch": self._watch_note,
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
        if not self._identity.same(current):
            return True
        # same objects, pointers and strides: the views made at build time read their bytes
        watch = self._watch
        if watch is not None:
            verdict = watch.check()  # 0 unchanged, 1 changed, 2 no longer watching
            if verdict == 1:
                return True
            if verdict == 0:
                rest = self._unwatched
                if rest is not None and _C._fingerprints(rest[0]) != rest[1]:
                    return True
                return bool(self._gapped) and self._gapped_changed(current)
            # a forked child, or the memory remapped: hash every weight from here on
            self._watch, self._watch_note = None, "dropped (a forked child or a remapping)"
            self._hashed_nbytes = self._nbytes
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
        return bool(self._gapped) and self._gapped_changed(current)

    def _gapped_changed(self, current: Sequence[torch.Tensor]) -> bool:
        """Whether a weight with gaps (hashed from a dense copy) holds other bytes."""
        return any(fingerprint(current[i], self._digest) != p for i, p in self._gapped)

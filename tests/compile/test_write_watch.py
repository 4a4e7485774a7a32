"""The kernel's write tracking under the baked-weight check (csrc/runtime/write_watch.h,
conversion/freezing.py): every write to a watched weight is seen, whoever makes it (numpy,
another thread, the kernel's own read(), a discarded page), by every watch over those bytes; a
forked child and memory other processes can write fall back to hashing; compiled models see
each training idiom through it and rebuild."""

from __future__ import annotations

import mmap
import os
import re
import subprocess
import sys
import threading

import pytest
import torch

from tests.compile.bpu_helpers import compile_bpu
from tests.compile.test_live_weights import IDIOMS, Wide, _fresh
from torch_fl import _C
from torch_fl.bpu import report
from torch_fl.bpu.conversion import freezing

UNAVAILABLE = _C._write_watch_unavailable()
needs_watch = pytest.mark.skipif(bool(UNAVAILABLE), reason=f"no write tracking: {UNAVAILABLE}")
PAGE = mmap.PAGESIZE


def _watch(*tensors: torch.Tensor):
    watch, why = _C._write_watch([(t.data_ptr(), t.nbytes) for t in tensors])
    assert watch is not None, why
    return watch


def _set(t: torch.Tensor, index: int, value: float) -> None:
    t.detach().numpy().reshape(-1)[index] = value  # no version bump, as a numpy user writes


@needs_watch
def test_every_write_is_seen_and_equal_bytes_are_not_a_change():
    big = torch.randn(1000, 1000)  # its pages watched
    small = torch.randn(10)  # too few bytes for a scan of their own: hashed on every check
    watch = _watch(big, small)
    assert watch.watched_bytes == big.nbytes and watch.runs == 1
    assert watch.hashed_bytes == small.nbytes
    assert watch.check() == 0 and watch.check() == 0
    old = big.reshape(-1)[777_777].item()
    _set(big, 777_777, old)  # the same bytes written: the page is hashed, equal
    assert watch.check() == 0
    _set(big, 777_777, old + 1.0)
    assert watch.check() == 1
    _set(big, 777_777, old)
    assert watch.check() == 0  # back to the baked bytes
    _set(small, 3, 123.0)
    assert watch.check() == 1


@needs_watch
def test_the_last_byte_of_a_partial_page_and_the_first_of_a_weight():
    t = torch.randn(3 * PAGE)  # 12 pages of floats: a partial page at each end unless aligned
    watch = _watch(t)
    for index in (0, t.numel() - 1, PAGE // 4, t.numel() // 2):
        old = t[index].item()
        _set(t, index, -old - 1.0)
        assert watch.check() == 1, index
        _set(t, index, old)
        assert watch.check() == 0, index


def _page_aligned(pages: int) -> tuple[torch.Tensor, int]:
    """A tensor of `pages` + 1 pages of floats and the index of its first page-aligned float."""
    base = torch.randn((pages + 1) * PAGE // 4)
    return base, (-base.data_ptr()) % PAGE // 4


@needs_watch
def test_a_partial_page_is_watched_for_the_weights_bytes_on_it():
    """A weight's partial pages are watched too: a write to the page's other bytes is no change;
    a page written that way on three checks (it shares the page with busy memory) is dropped
    from the watch and its bytes of the weight hashed on every check from then on."""
    p4 = PAGE // 4
    base, at = _page_aligned(64)
    start, end = at + p4 + 3, at + 40 * p4 + 5  # inside page 1 to inside page 40
    weight = base[start:end]
    watch = _watch(weight)
    assert (watch.runs, watch.hashed_bytes, watch.watched_bytes) == (1, 0, weight.nbytes)
    for n in range(3):
        _set(base, start - 1, float(n))  # the float before the weight, on its first page
        _set(base, end, float(n))  # the float after it, on its last page
        assert watch.check() == 0, n
    head, tail = PAGE - 12, 20  # the weight's bytes on its first and last page
    assert watch.hashed_bytes == head + tail
    assert watch.watched_bytes == weight.nbytes - head - tail and watch.runs == 1
    for index in (0, weight.numel() - 1, p4):  # on the dropped pages, and on a watched one
        old = weight[index].item()
        _set(weight, index, old + 1.0)
        assert watch.check() == 1, index
        _set(weight, index, old)
        assert watch.check() == 0, index


@needs_watch
def test_a_short_gap_between_weights_is_watched_and_a_busy_one_dropped():
    """Two weights two pages apart take one scan: the gap's pages are watched, a write to them
    is no change, and a gap page written on three checks leaves the watch (two runs then).
    Weights further apart, or too few bytes to be worth a scan, are not joined."""
    p4 = PAGE // 4
    base, at = _page_aligned(64)
    first, second = base[at : at + 8 * p4], base[at + 10 * p4 : at + 18 * p4]
    watch = _watch(first, second)
    assert (watch.runs, watch.hashed_bytes) == (1, 0)
    assert watch.watched_bytes == first.nbytes + second.nbytes
    for n in range(3):
        _set(base, at + 9 * p4 + 7, float(n))
        assert watch.check() == 0, n
    assert (watch.runs, watch.hashed_bytes) == (2, 0)
    _set(second, 5, second[5].item() + 1.0)
    assert watch.check() == 1

    # explain() reads the watch as it stands, not as armed
    frozen = freezing.FrozenWeights((0, 1), [first, second], watch=True)
    assert "watched in 1 run(s)" in frozen.describe()["watch"]
    for n in range(3):
        _set(base, at + 9 * p4 + 7, float(n + 5))
        assert not frozen.stale([first, second]), n
    assert "watched in 2 run(s)" in frozen.describe()["watch"]

    far = base[at + 30 * p4 : at + 38 * p4]  # 12 pages after `second`
    assert _watch(first, far).runs == 2
    few = base[at + 50 * p4 : at + 50 * p4 + 100]  # 400 bytes: hashed on every check
    watch = _watch(first, few)
    assert (watch.runs, watch.hashed_bytes, watch.watched_bytes) == (1, 400, first.nbytes)
    _set(few, 99, few[99].item() + 1.0)
    assert watch.check() == 1


@needs_watch
def test_two_watches_over_the_same_bytes_both_see_a_write():
    """The kernel keeps one 'written' bit per page: the first watch's scan re-protects it, so
    the second learns of the write from the counts the first one made."""
    t = torch.randn(1 << 20)
    first, second = _watch(t), _watch(t)
    _set(t, 500_000, 7.0)
    assert first.check() == 1 and second.check() == 1
    third = _watch(t)  # armed after the write: these are its baked bytes
    assert third.check() == 0
    del first
    assert second.check() == 1  # a watch going away keeps the others' counts


@needs_watch
def test_writes_by_another_thread_the_kernel_and_a_discarded_page():
    import ctypes

    t = torch.randn(1 << 20)
    watch = _watch(t)
    worker = threading.Thread(target=_set, args=(t, 12345, 9.0))
    worker.start()
    worker.join()
    assert watch.check() == 1

    watch = _watch(t)
    with open("/dev/urandom", "rb") as random_bytes:  # the kernel writes through read()
        random_bytes.readinto(memoryview(t.numpy()).cast("B")[2 * PAGE : 2 * PAGE + 64])
    assert watch.check() == 1

    watch = _watch(t)
    page = (t.data_ptr() + 4 * PAGE) // PAGE * PAGE
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.madvise(ctypes.c_void_p(page), PAGE, 4) == 0  # MADV_DONTNEED: reads zeros
    assert watch.check() == 1


@needs_watch
def test_memory_other_processes_write_is_hashed_not_watched(tmp_path):
    shared = torch.randn(1 << 18).share_memory_()  # another process writes it unseen here
    watch, why = _C._write_watch([(shared.data_ptr(), shared.nbytes)])
    assert watch is None and "private anonymous" in why
    path = tmp_path / "weights.bin"
    path.write_bytes(torch.randn(1 << 18).numpy().tobytes())
    mapped = torch.from_file(str(path), shared=False, size=1 << 18)  # a private file mapping
    own = torch.randn(1 << 18)
    watch = _watch(mapped, shared, own)
    assert watch.hashed_bytes >= mapped.nbytes + shared.nbytes
    assert watch.check() == 0
    _set(shared, 5, 1e9)
    assert watch.check() == 1


FORKED = """
import os, torch
from torch_fl import _C
t = torch.randn(1 << 20)
watch, why = _C._write_watch([(t.data_ptr(), t.nbytes)])
assert watch is not None, why
pid = os.fork()
if pid == 0:  # a child's registrations are gone: it must not trust a clean scan
    os._exit(0 if watch.check() == 2 else 3)
_, status = os.waitpid(pid, 0)
code = os.waitstatus_to_exitcode(status)
assert code == 0, code
assert watch.check() == 0  # the parent's watch goes on
t.numpy()[99] += 1.0
assert watch.check() == 1

# forks while another thread is inside a scan: each child arms and checks a watch of its own
# (the process-wide lock must not stay held in the child)
import threading
stop = threading.Event()
def hammer():
    while not stop.is_set():
        watch.check()
worker = threading.Thread(target=hammer)
worker.start()
try:
    for _ in range(20):
        pid = os.fork()
        if pid == 0:
            own = torch.randn(1 << 18)
            mine, why = _C._write_watch([(own.data_ptr(), own.nbytes)])
            ok = mine is not None and mine.check() == 0 and watch.check() == 2
            own.numpy()[7] += 1.0
            os._exit(0 if ok and mine.check() == 1 else 4)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
finally:
    stop.set()
    worker.join()
"""


@needs_watch
def test_a_forked_child_stops_trusting_the_watch():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", FORKED], env=env, timeout=120, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]


@needs_watch
def test_frozen_weights_check_through_the_watch():
    args = [torch.randn(2), torch.randn(1 << 19), torch.randn(4, 4).t(), torch.randn(7)]
    positions = (1, 2, 3)
    frozen = freezing.FrozenWeights(positions, args, watch=True)
    check = frozen.describe()
    assert check["pass"] == "write-watch" and "MB watched" in check["watch"]
    # the bytes it hashes a call are far under OVERLAP_BYTES (whether it runs beside the call
    # also rests on its timed check, which a loaded host can push past OVERLAP_CHECK_S: a lane
    # run on 2 busy workers did)
    assert frozen._hashed_nbytes < freezing.OVERLAP_BYTES // 8
    assert not frozen.stale(args)
    _set(args[1], 1000, 5.0)
    assert frozen.stale(args)
    frozen = freezing.FrozenWeights(positions, args, watch=True)
    args[2].data.numpy()[0, 1] = 5.0  # the non-contiguous weight: hashed on every call
    assert frozen.stale(args)
    frozen = freezing.FrozenWeights(positions, args, watch=True)
    _set(args[3], 6, -1.0)  # a weight inside one page
    assert frozen.stale(args)
    frozen = freezing.FrozenWeights(positions, args, watch=True)
    args[1].data = args[1].data.clone()  # other memory: the identity check
    assert frozen.stale(args)


@needs_watch
def test_pinned_weights_are_hashed_on_every_call(monkeypatch):
    """A device writes pinned memory by DMA, unseen by the page tables: not watched."""
    args = [torch.randn(1 << 19), torch.randn(1 << 19)]
    pinned = args[1].data_ptr()
    monkeypatch.setattr(freezing, "_pinned", lambda view: view.data_ptr() == pinned)
    frozen = freezing.FrozenWeights((0, 1), args, watch=True)
    assert frozen._watch is not None and frozen._hashed_nbytes >= args[1].nbytes
    assert not frozen.stale(args)
    _set(args[1], 10, 3.0)
    assert frozen.stale(args)


@needs_watch
def test_a_write_while_the_watch_is_armed_drops_it(monkeypatch):
    """Between the build's fingerprints and the pages' protection a write is in neither the
    baked prints nor a later scan: the weights are compared once more after arming."""
    args = [torch.randn(1 << 19)]
    arm = _C._write_watch

    def arm_then_write(ranges):
        out = arm(ranges)
        _set(args[0], 77, 1e6)
        return out

    monkeypatch.setattr(freezing._C, "_write_watch", arm_then_write)
    frozen = freezing.FrozenWeights((0,), args, watch=True)
    assert frozen._watch is None and "changed while the watch was armed" in frozen._watch_note
    assert frozen.stale(args)


@needs_watch
def test_a_dropped_watch_hashes_everything(monkeypatch):
    args = [torch.randn(1 << 19)]
    frozen = freezing.FrozenWeights((0,), args, watch=True)

    class Gone:
        def check(self):
            return 2

    frozen._watch = Gone()
    assert not frozen.stale(args) and frozen._watch is None
    check = frozen.describe()
    assert check["pass"] != "write-watch" and check["watch"].startswith("dropped (a forked")
    _set(args[0], 1, 2.0)
    assert frozen.stale(args)


def _watched_then_changed(change, first=lambda rt: None):
    """A compiled sim Wide under the watch: its first call (`first(rt)` then), a second equal
    one without a rebuild, `change(model)`, a third call. (model, x, runtime, the outputs before
    and after, the explain() table)"""
    model = Wide().eval()
    x = torch.randn(4, 512)
    compiled = compile_bpu(model, executor="sim", sim_threads=1, sim_thread_choice="fixed")
    with report.collect() as reps, torch.no_grad():
        before = compiled(x)
        rt = reps[0].runtimes[0]
        first(rt)
        assert rt.entry.weight_check["pass"] == "write-watch"
        assert torch.equal(compiled(x), before) and rt.builds == 1
        change(model)
        after = compiled(x)
    return model, x, rt, before, after, report.Report(reps).table()


@needs_watch
@pytest.mark.parametrize("idiom", sorted(set(IDIOMS) - {"buffers_via_data"}))
def test_compiled_weights_under_the_watch_rebuild_on_every_idiom(idiom):
    model, x, rt, before, after, text = _watched_then_changed(IDIOMS[idiom])
    assert rt.builds == 2 and not torch.allclose(after, before)
    assert torch.equal(after, _fresh(model, x, "sim"))
    # its check, timed when the watch was armed, is far under freezing.OVERLAP_CHECK_S
    assert re.search(
        r"before the call, write-watch on up to 1 CPU; timed when armed: write-watch "
        r"[\d.]+ us \(2\.\d MB watched in \d+ run",
        text,
    )


def test_weight_watch_off_hashes_every_weight():
    model = Wide().eval()
    x = torch.randn(4, 512)
    compiled = compile_bpu(model, executor="sim", sim_threads=1, weight_watch=False)
    with report.collect() as reps, torch.no_grad():
        compiled(x)
    check = reps[0].runtimes[0].entry.weight_check
    assert check["pass"] in ("native", "xxh3") and check["watch"] == "off (weight_watch=False)"
    # explain() says why no watch runs
    assert "(write watch: off (weight_watch=False))" in report.Report(reps).table()


@needs_watch
def test_flagos_weights_under_the_watch():
    """flagos weights live in host memory here: watched, and a write through `.data` rebuilds."""
    model = Wide().eval().to("flagos")
    x = torch.randn(4, 512, device="flagos")
    compiled = compile_bpu(model, executor="sim", sim_threads=1, sim_thread_choice="fixed")
    with report.collect() as reps, torch.no_grad():
        before = compiled(x)
        rt = reps[0].runtimes[0]
        assert rt.entry.weight_check["pass"] == "write-watch"
        model.fc1.weight.data.mul_(-1.0)
        after = compiled(x)
    assert rt.builds == 2 and not torch.allclose(after.cpu(), before.cpu())


@pytest.mark.board
def test_the_check_sees_a_write_with_or_without_the_kernels_tracking():
    """On any machine (the boards' kernels may lack PAGEMAP_SCAN): the watch is armed, or
    explain() names why not; either way a write through numpy is seen."""
    args = [torch.randn(1 << 19), torch.randn(5)]
    frozen = freezing.FrozenWeights((0, 1), args, watch=True)
    check = frozen.describe()
    if UNAVAILABLE:
        assert frozen._watch is None and UNAVAILABLE in frozen._watch_note
        assert check["pass"] in ("native", "xxh3")
    else:
        assert check["pass"] == "write-watch"
    assert not frozen.stale(args)
    _set(args[0], 4321, 1e3)
    assert frozen.stale(args)


def test_a_kernel_that_refuses_leaves_the_full_pass(monkeypatch):
    """Where the probe fails (a stand-in for a kernel before 6.7 here), the note names why,
    explain() shows the hashing pass, and a write is still seen."""
    monkeypatch.setattr(
        freezing._C, "_write_watch", lambda ranges: (None, "no PAGEMAP_SCAN ioctl (stand-in)")
    )
    args = [torch.randn(1 << 19)]
    frozen = freezing.FrozenWeights((0,), args, watch=True)
    assert (
        frozen._watch is None
        and frozen._watch_note == "unavailable: no PAGEMAP_SCAN ioctl (stand-in)"
    )
    check = frozen.describe()
    assert check["pass"] in ("native", "xxh3") and check["watch"] == frozen._watch_note
    assert not frozen.stale(args)
    _set(args[0], 99, -7.0)
    assert frozen.stale(args)


@needs_watch
def test_a_costly_watched_check_runs_beside_the_call(monkeypatch):
    """freezing.OVERLAP_CHECK_S: the watched check is timed when armed, and one that took that
    long or more runs on the checker thread where a CPU is free; a write is still seen there."""
    monkeypatch.setattr(freezing, "_usable_cpus", lambda: 4)
    args = [torch.randn(1 << 19), torch.randn(300)]
    frozen = freezing.FrozenWeights((0, 1), args, watch=True)
    check = frozen.describe()
    assert check["pass"] == "write-watch" and check["timed_when"] == "when armed"
    timed = check["timed_us"]["write-watch"]
    assert 0 < timed < 1e6
    monkeypatch.setattr(freezing, "OVERLAP_CHECK_S", timed / 2 * 1e-6)
    assert frozen.can_overlap(1) and not frozen.can_overlap(4)
    monkeypatch.setattr(freezing, "OVERLAP_CHECK_S", timed * 2 * 1e-6)
    assert not frozen.can_overlap(1)
    # end to end: beside the call, through the watch, and a write through .data rebuilds
    monkeypatch.setattr(freezing, "OVERLAP_CHECK_S", 0.0)

    def beside(rt) -> None:
        assert rt._frozen.overlap and rt.entry.weight_check["beside"]

    model, x, rt, before, after, text = _watched_then_changed(
        lambda m: m.fc1.weight.data.mul_(-1.0), beside
    )
    assert rt.builds == 2 and torch.equal(after, _fresh(model, x, "sim"))
    assert re.search(r"beside the call, write-watch on up to 3 CPUs; timed when armed", text)

"""Weights changed after compilation are what the next call runs with, for every executor.

The idioms are the ones training and EMA code use; several of them (writes through `.data`,
through a numpy view, `p.data = ...`) do not bump the parameter's version counter.
"""

import copy
import sys
import time

import pytest
import torch
from torch import nn

from tests.compile.bpu_helpers import STANDINS, compile_bpu, cosine
from tests.compile.test_drivers import libhbtl, x86  # noqa: F401  (fixtures)
from torch_fl.bpu import report


class Net(nn.Module):
    """Conv weight, BN parameters and running stats, a linear layer: every kind of frozen input."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 4 * 4, 8)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(torch.nn.functional.max_pool2d(y, 2).flatten(1))


def _new_values(model):
    gen = torch.Generator().manual_seed(7)
    return [torch.randn(p.shape, generator=gen) * 0.2 for p in model.parameters()]


def _copy_data(model):
    for p, v in zip(model.parameters(), _new_values(model), strict=True):
        p.data.copy_(v)


def _assign_data(model):
    for p, v in zip(model.parameters(), _new_values(model), strict=True):
        p.data = v.clone()


def _vector_to_parameters(model):
    values = _new_values(model)
    nn.utils.vector_to_parameters(torch.cat([v.flatten() for v in values]), model.parameters())


def _ema(model):
    decay = 0.5
    for p, v in zip(model.parameters(), _new_values(model), strict=True):
        p.data.mul_(decay).add_(v, alpha=1 - decay)


def _numpy_view(model):
    for p, v in zip(model.parameters(), _new_values(model), strict=True):
        p.detach().numpy()[...] = v.numpy()


def _running_stats_through_data(model):
    model.bn.running_mean.data.add_(0.5)
    model.bn.running_var.data.mul_(3.0)


IDIOMS = {
    "data.copy_": _copy_data,
    "p.data=": _assign_data,
    "vector_to_parameters": _vector_to_parameters,
    "ema": _ema,
    "numpy_view": _numpy_view,
    "buffers_via_data": _running_stats_through_data,
}


EXECUTORS = {
    "eager": {"executor": "eager"},
    "sim": {"executor": "sim"},  # sim_weights="checked" by default: baked, int8 kernels
    # live weights never rebuild, so activation scales guessed on a first call would stay those
    # of the old weights while a fresh compile guesses anew: compare at the default scale
    "sim-live": {"executor": "sim", "sim_weights": "live", "calibrate": "none"},
}


def _fresh(model, x, executor):
    """What a compilation made after the change computes (the reference for stale outputs)."""
    torch._dynamo.reset()
    with torch.no_grad():
        return compile_bpu(copy.deepcopy(model), **EXECUTORS.get(executor, {"executor": executor}))(
            x
        )


@pytest.mark.parametrize("executor", sorted(EXECUTORS))
@pytest.mark.parametrize("idiom", sorted(IDIOMS))
def test_changed_weights_run(executor, idiom):
    model = Net().eval()
    x = torch.randn(2, 3, 8, 8)
    compiled = compile_bpu(model, **EXECUTORS[executor])
    with report.collect() as reps, torch.no_grad():
        before = compiled(x)
        compiled(x)
        IDIOMS[idiom](model)
        after = compiled(x)
        compiled(x)
    assert not torch.allclose(after, before)
    if executor == "eager":
        with torch.no_grad():
            assert torch.equal(after, model(x))
        return
    # live weights: nothing rebuilt; checked weights: rebuilt once, on the change
    assert reps[0].runtimes[0].builds == (1 if executor == "sim-live" else 2)
    assert torch.equal(after, _fresh(model, x, executor))


def test_transposed_view_assigned_to_data():
    """Same storage, other strides: the new layout is what runs."""
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval()
    x = torch.randn(3, 8)
    compiled = compile_bpu(model, executor="sim")
    with torch.no_grad():
        before = compiled(x)
        model[0].weight.data = model[0].weight.data.t()
        after = compiled(x)
    assert not torch.allclose(after, before)
    assert torch.equal(after, _fresh(model, x, "sim"))


@pytest.fixture
def board(x86, monkeypatch, request):  # noqa: F811
    x86(emulated=True)  # the emulated path shims torch out of the compiler: faster, same artifact
    monkeypatch.syspath_prepend(str(STANDINS / "hbm_runtime"))
    request.addfinalizer(lambda: sys.modules.pop("hbm_runtime", None))


@pytest.mark.parametrize("idiom", sorted(IDIOMS))
def test_changed_weights_rebuild_hbm(board, idiom):
    model = Net().eval()
    x = torch.randn(2, 3, 8, 8)
    compiled = compile_bpu(model, executor="hbm")
    with report.collect() as reps, torch.no_grad():
        before = compiled(x)
        compiled(x)
        rt = reps[0].runtimes[0]
        assert rt.builds == 1  # unchanged weights: no rebuild
        IDIOMS[idiom](model)
        after = compiled(x)
        assert rt.builds == 2
        compiled(x)
        assert rt.builds == 2
    assert not torch.allclose(after, before)
    # A fresh compile hashes the new weights into its graph key: it finds the rebuilt artifact
    # only if that was built from them (else it builds its own, and the outputs differ).
    assert torch.equal(after, _fresh(model, x, "hbm"))
    with torch.no_grad():
        assert cosine(after, model(x)) > 0.99


def test_hbm_on_stale_eager(board):
    model = Net().eval()
    x = torch.randn(2, 3, 8, 8)
    compiled = compile_bpu(model, executor="hbm", on_stale="eager")
    with report.collect() as reps, torch.no_grad():
        compiled(x)
        _ema(model)
        with pytest.warns(UserWarning, match="frozen weights changed"):
            out = compiled(x)
        assert torch.equal(out, model(x)) and reps[0].runtimes[0].kind == "eager"


@pytest.mark.parametrize(
    ("gil_free", "threads"),
    [(False, None), (True, 1), (True, 3), (None, None)],
    ids=["xxh3", "native", "native-3-threads", "picked-at-build"],
)
def test_baked_weight_check_is_bytewise(gil_free, threads):
    """Both fingerprints: XXH3, and the extension's GIL-free one (on one thread or several),
    and whichever the build picked for the caller's thread."""
    from torch_fl.bpu.conversion import freezing
    from torch_fl.bpu.conversion.freezing import FrozenWeights

    def stale(frozen, args):
        return frozen.stale(args, gil_free=gil_free, threads=threads)

    w = torch.randn(4, 4)
    w[0, 0] = float("nan")  # NaN != NaN numerically; the bytes are unchanged
    t = torch.randn(4, 4).t()  # non-contiguous
    big = torch.randn(300_000)  # over python-xxhash's 64 KB GIL threshold
    # more than OVERLAP_BYTES in all, so that the build times both passes, in weights of a
    # megabyte or more, so that several threads get some
    more = [torch.randn(1 << 18) for _ in range(3)]
    args = [torch.randn(2), w, t, big, *more]
    positions = (1, 2, 3, 4, 5, 6)
    frozen = FrozenWeights(positions, args)
    assert frozen.inline_pass in ("xxh3", "native")
    assert not stale(frozen, args)
    w.detach().numpy()[3, 3] += 1.0  # no version bump
    assert stale(frozen, args)
    frozen = FrozenWeights(positions, args)
    t.data.numpy()[0, 1] = 5.0  # through a view of the non-contiguous tensor
    assert stale(frozen, args)
    frozen = FrozenWeights(positions, args)
    big.data.numpy()[-1] *= -1.0  # the last word of a large weight
    assert stale(frozen, args)
    frozen = FrozenWeights(positions, args)
    more[1].numpy()[12345] += 1.0  # a weight that another thread hashes
    assert stale(frozen, args)
    frozen = FrozenWeights(positions, args)
    assert not stale(frozen, args)
    args[2].data = args[2].data.clone()  # same values, other memory
    assert stale(frozen, args)
    assert freezing.OVERLAP_BYTES < frozen._nbytes


def test_check_beside_the_call_hashes_on_the_cpus_the_executor_leaves(monkeypatch):
    from torch_fl.bpu.conversion import freezing

    monkeypatch.setattr(freezing, "_usable_cpus", lambda: 8)
    args = [torch.randn(1 << 19)]  # 2 MB
    frozen = freezing.FrozenWeights((0,), args, busy_cpus=3)
    assert frozen.overlap and frozen._beside_threads == 5 and frozen._inline_threads == 8
    frozen.occupy(8)  # the executor takes every CPU: the check runs before the call
    assert not frozen.overlap and frozen._beside_threads == 1
    frozen.occupy(1)  # the board's BPU: one CPU waits on it, seven hash
    assert frozen.overlap and frozen._beside_threads == 7
    assert not frozen.check_in_background(args)()
    args[0].numpy()[0] += 1.0
    assert frozen.check_in_background(args)()
    assert frozen._inline_pass is None  # only ever checked beside the call: never timed


def test_live_bias_beyond_int32_raises_its_channel_weight_scale():
    """Activation scales are fixed at build; a bias grown past int32 at that scale raises its
    channel's weight scale in the live graph (qdq.bias_floor, computed from the live bias), as
    the Q/DQ pass does at build: the bias is held exactly instead of wrapping or saturating."""
    model = nn.Conv2d(1, 2, 1).eval()
    with torch.no_grad():
        model.weight.fill_(1.0)
        model.bias.fill_(1.0)
    x = torch.zeros(1, 1, 2, 2)
    compiled = compile_bpu(
        model, executor="sim", sim_weights="live", act_scale=1e-6, calibrate="none"
    )
    with torch.no_grad():
        assert torch.allclose(compiled(x), torch.ones(1, 2, 2, 2))
        model.bias.data[0] = 100.0  # 100 / (1e-6 x 1/127) is far beyond int32
        out = compiled(x)
    # clipped at the old scale it would be 2^30 x 1e-6 / 127 ~ 8.45; channel 1 is untouched
    assert torch.allclose(out[0, 0], torch.full_like(out[0, 0], 100.0), rtol=1e-6)
    assert torch.allclose(out[0, 1], torch.ones_like(out[0, 1]))


class Wide(nn.Module):
    """2 MB of weights: the baked-weight check runs beside the call (freezing.OVERLAP_BYTES)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(512, 1024)
        self.fc2 = nn.Linear(1024, 16)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _wide_compiled(threads: int = 1):
    """A compiled Wide after its first call: (model, input, compiled, its runtime, output).
    One ORT thread: a CPU stays free for the checker thread. Exactly `threads` (not the
    measured choice among 1..threads). Without the kernel's write tracking, which would leave
    nothing to hash beside the call (tests/compile/test_write_watch.py)."""
    model = Wide().eval()
    x = torch.randn(4, 512)
    compiled = compile_bpu(
        model, executor="sim", sim_threads=threads, sim_thread_choice="fixed", weight_watch=False
    )
    with report.collect() as reps, torch.no_grad():
        before = compiled(x)
    return model, x, compiled, reps[0].runtimes[0], before


@pytest.mark.parametrize("idiom", ["data.copy_", "numpy_view", "ema"])
def test_background_check_sees_changes_that_bump_no_version(idiom):
    from torch_fl.bpu.conversion import freezing

    if freezing._usable_cpus() < 2:
        pytest.skip("one usable CPU: the check runs before the call")
    model, x, compiled, rt, before = _wide_compiled()
    check = rt.entry.weight_check
    assert check == {
        "beside": True,
        "threads": freezing._usable_cpus() - 1,
        "pass": "native",
        "watch": "off (weight_watch=False)",
    }
    with torch.no_grad():
        assert rt._frozen is not None and rt._frozen.overlap
        assert torch.equal(compiled(x), before) and rt.builds == 1
        IDIOMS[idiom](model)
        after = compiled(x)
    assert rt.builds == 2 and not torch.allclose(after, before)
    assert torch.equal(after, _fresh(model, x, "sim"))


def test_background_check_reads_flagos_weights():
    """Weights in flagos memory: the checker thread hashes their host views without the GIL,
    and a write through `.data` (no version bump) still rebuilds."""
    from torch_fl.bpu.conversion import freezing

    if freezing._usable_cpus() < 2:
        pytest.skip("one usable CPU: the check runs before the call")
    model = Wide().eval().to("flagos")
    x = torch.randn(4, 512, device="flagos")
    compiled = compile_bpu(
        model, executor="sim", sim_threads=1, sim_thread_choice="fixed", weight_watch=False
    )
    with report.collect() as reps, torch.no_grad():
        before = compiled(x)
        rt = reps[0].runtimes[0]
        assert rt._frozen is not None and rt._frozen.overlap
        assert torch.equal(compiled(x).cpu(), before.cpu()) and rt.builds == 1
        model.fc1.weight.data.mul_(-1.0)
        after = compiled(x)
    assert rt.builds == 2 and after.device.type == "flagos"
    assert not torch.allclose(after.cpu(), before.cpu())


def test_no_free_cpu_beside_the_executor_checks_before_the_call():
    """ORT on every CPU (sim_threads=0): a checker thread would only share a core with it."""
    from torch_fl.bpu.conversion import freezing

    threads = freezing._usable_cpus()
    model = Wide().eval()
    x = torch.randn(4, 512)
    compiled = compile_bpu(
        model, executor="sim", sim_threads=threads, sim_thread_choice="fixed", weight_watch=False
    )
    with report.collect() as reps, torch.no_grad():
        before = compiled(x)
    rt = reps[0].runtimes[0]
    check = rt.entry.weight_check
    assert not check["beside"] and check["pass"] in ("xxh3", "native")
    assert set(check["timed_us"]) == {"xxh3", "native"}  # 2 MB: both passes timed
    # the faster of the two was kept
    assert check["timed_us"][check["pass"]] == min(check["timed_us"].values())
    text = report.Report(reps).table()
    cpus = f"{check['threads']} CPU{'s' * (check['threads'] > 1)}"
    assert (
        f"part 0: before the call, {check['pass']} on up to {cpus}; timed on first use: xxh3 "
        in text
    )
    with torch.no_grad():
        assert not rt._frozen.overlap
        _copy_data(model)
        assert not torch.allclose(compiled(x), before) and rt.builds == 2


def test_one_usable_cpu_checks_before_the_call(monkeypatch):
    from torch_fl.bpu.conversion import freezing

    monkeypatch.setattr(freezing, "_usable_cpus", lambda: 1)
    model, x, compiled, rt, before = _wide_compiled()
    with torch.no_grad():
        assert not rt._frozen.overlap
        _copy_data(model)
        assert not torch.allclose(compiled(x), before) and rt.builds == 2


FORKED_CHILD = """
import os, torch
from tests.compile.test_live_weights import Wide, _copy_data
from tests.compile.bpu_helpers import compile_bpu
from torch_fl.bpu.conversion import freezing
model = Wide().eval()
x = torch.randn(4, 512)
compiled = compile_bpu(model, executor="sim", sim_threads=1, weight_watch=False)
with torch.no_grad():
    before = compiled(x)  # the parent's checker thread exists now
assert compiled._orig_mod is model and freezing._pool is not None
pid = os.fork()
if pid == 0:  # the child's exit code says whether it saw the change
    code = 1
    try:
        _copy_data(model)
        with torch.no_grad():
            code = 0 if not torch.allclose(compiled(x), before) else 2
    finally:
        os._exit(code)
_, status = os.waitpid(pid, 0)
raise SystemExit(os.waitstatus_to_exitcode(status))
"""


def test_background_check_in_a_forked_child():
    """Threads do not survive fork: a forked child gets its own checker thread, not a hang.
    (In a subprocess with one OpenMP thread: torch's own OpenMP pool hangs a forked child.)"""
    import os
    import subprocess

    from torch_fl.bpu.conversion import freezing

    if freezing._usable_cpus() < 2 or not hasattr(os, "fork"):
        pytest.skip("needs fork and two usable CPUs")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", FORKED_CHILD], env=env, timeout=120, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_check_before_the_call_takes_the_faster_pass_measured_on_first_use(monkeypatch):
    """Both passes are timed when the check before the call is first needed; it uses the
    faster (here XXH3 made slow, so the extension's fingerprint wins) and still sees a write."""
    import xxhash

    from torch_fl.bpu.conversion import freezing

    def slow_xxh3(view):
        time.sleep(0.02)  # far beyond the native pass on 3 MB, even on a loaded machine
        return xxhash.xxh3_128_intdigest(view)

    monkeypatch.setattr(freezing, "_hasher", lambda: slow_xxh3)
    args = [torch.randn(1 << 19), torch.randn(1 << 18)]  # 3 MB
    frozen = freezing.FrozenWeights((0, 1), args)
    assert frozen.inline_pass == "native"
    assert not frozen.stale(args)
    args[1].numpy()[-1] += 1.0
    assert frozen.stale(args)
    small = freezing.FrozenWeights((0,), [torch.randn(16)])  # under OVERLAP_BYTES: not timed
    assert small.inline_pass == "xxh3"

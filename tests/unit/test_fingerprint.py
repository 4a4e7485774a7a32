"""The extension's content fingerprint (csrc/runtime/fingerprint.cpp), which the baked-weight
check's checker thread compares (torch_fl/bpu/conversion/freezing.py): every changed bit of a
range changes it, lengths are told apart, bad input is refused by name, and it hashes without
holding the GIL. Also on the board (aarch64), where the same C++ is built there."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from torch_fl import _C


def _print(tensor: torch.Tensor) -> bytes:
    return _C._fingerprints([tensor])


@pytest.mark.board
def test_every_flipped_bit_changes_it_at_every_tail_length():
    # 0..137 bytes: empty, the tail alone, whole 64-byte blocks and every tail after them; then
    # ranges of four groups' quarters, with blocks left over and a tail (flipped through a numpy
    # view: torch indexing per bit is minutes under the board's TCG)
    gen = np.random.default_rng(0)
    for length in [*range(138), 256, 64 * 6 + 13, 64 * 11 + 7]:
        raw = gen.integers(0, 256, length, dtype=np.uint8)
        data = torch.from_numpy(raw)
        base = _print(data)
        assert len(base) == 16
        for index in range(length):
            for bit in range(8):
                raw[index] ^= 1 << bit
                assert _print(data) != base, (length, index, bit)
                raw[index] ^= 1 << bit
        assert _print(data) == base


@pytest.mark.board
def test_changes_that_cancel_in_plain_arithmetic_are_seen():
    w = torch.randn(4096)
    base = _print(w.view(torch.uint8))
    # two sign flips in the same lane (16 floats = one 64-byte block apart), and a swap
    for change in ([0, 16], [5, 21, 37, 53]):
        v = w.clone()
        v[change] = -v[change]
        assert _print(v.view(torch.uint8)) != base
    # a sign flip, and the exponent bit that a one-multiply step carried it to, in the lane's
    # next word 64 bytes on: the same print before the step mixed twice
    words = w.clone().view(torch.int64)
    words[0] ^= torch.tensor(-(2**63), dtype=torch.int64)
    words[8] ^= 1 << 28
    assert _print(words.view(torch.uint8)) != base
    swapped = w.clone()
    swapped[[3, 19]] = swapped[[19, 3]]
    assert _print(swapped.view(torch.uint8)) != base
    assert _print(w.clone().view(torch.uint8)) == base  # other memory, same bytes: same print


def _flip(raw: np.ndarray, word: int, bit: int) -> None:
    raw[word] ^= np.uint64(1) << np.uint64(bit)


@pytest.mark.parametrize(
    "later", [8, 1, 16, 40], ids=["same-lane", "next-lane", "next-block", "other-group"]
)
def test_no_pair_of_flipped_bits_cancels(later):
    """Every pair of flipped bits, one in word 3 and one `later` words on (the same lane's next
    step, the next lane, a later block, another group's quarter), changes the print: a fixed
    pattern that cancels would hide a change from the check whatever the weights are."""
    raw = np.random.default_rng(later).integers(0, 2**63, 64, dtype=np.uint64)  # 8 blocks
    base = _print(torch.from_numpy(raw.view(np.uint8)))
    changed = []
    for i in range(64):
        for j in range(64):
            r = raw.copy()
            _flip(r, 3, i)
            _flip(r, 3 + later, j)
            changed.append(torch.from_numpy(r.view(np.uint8)))
    prints = _C._fingerprints(changed)
    same = [k for k in range(len(changed)) if prints[16 * k : 16 * k + 16] == base]
    assert not same, [divmod(k, 64) for k in same[:5]]


@pytest.mark.skipif(
    _C._fingerprint_kernel() == "portable", reason="no AVX-512 on this CPU: one form"
)
def test_the_avx512_form_computes_the_portable_function():
    gen = np.random.default_rng(1)
    lengths = [*range(0, 1100, 7), *gen.integers(1100, 1 << 21, 20).tolist()]
    tensors = [torch.from_numpy(gen.integers(0, 256, n, dtype=np.uint8)) for n in lengths]
    assert _C._fingerprints(tensors) == _C._fingerprints(tensors, portable=True)


def test_ranges_of_zeros_differ_by_length_and_prints_are_per_tensor():
    prints = {_print(torch.zeros(n, dtype=torch.uint8)) for n in range(300)}
    assert len(prints) == 300
    a, b = torch.randn(10), torch.randn(1000)
    both = _C._fingerprints([a.view(torch.uint8), b.view(torch.uint8)])
    assert both == _print(a.view(torch.uint8)) + _print(b.view(torch.uint8))
    assert _C._fingerprints([]) == b""


def test_prints_do_not_depend_on_the_threads_that_hash():
    gen = np.random.default_rng(2)
    sizes = [0, 3, 64, 1 << 20, 3 << 20, 5 << 20, 700_001, 1 << 21]  # several megabytes: bins
    tensors = [torch.from_numpy(gen.integers(0, 256, n, dtype=np.uint8)) for n in sizes]
    one = _C._fingerprints(tensors)
    for threads in (2, 3, 8, 64):
        assert _C._fingerprints(tensors, threads=threads) == one
    assert _C._fingerprints(tensors, portable=True, threads=3) == one


def test_bad_input_is_refused_by_name():
    with pytest.raises(RuntimeError, match="threads must be at least 1"):
        _C._fingerprints([torch.zeros(4)], threads=0)
    with pytest.raises((TypeError, RuntimeError), match="expected torch.Tensor"):
        _C._fingerprints([b"bytes"])
    with pytest.raises(RuntimeError, match="contiguous"):
        _C._fingerprints([torch.randn(4, 4).t()])
    with pytest.raises(RuntimeError, match="expected CPU tensors"):
        _C._fingerprints([torch.zeros(4, device="flagos")])
    with pytest.raises(TypeError):
        _C._fingerprints(3)


def test_hashing_releases_the_gil():
    """Python on another thread keeps running while one call hashes 256 MB (with the GIL held
    it would make no progress until the call returned)."""
    data = torch.ones(64 << 20).view(torch.uint8)  # 256 MB
    window: list[float] = []

    def hash_it():
        start = time.perf_counter()
        _C._fingerprints([data] * 4)  # 1 GB hashed: tens of ms even at AVX-512 speed
        window.extend([start, time.perf_counter()])

    ticks = []
    worker = threading.Thread(target=hash_it)
    worker.start()
    while worker.is_alive():
        ticks.append(time.perf_counter())
    worker.join()
    start, end = window
    inside = [t for t in ticks if start < t < end]
    # well over a few milliseconds of hashing; the interpreter switches threads every 5 ms, so
    # a GIL held throughout would leave at most a handful of ticks inside the window
    assert end - start > 0.005, "the buffer hashed too fast to tell"
    assert len(inside) > 1000, (len(inside), end - start)

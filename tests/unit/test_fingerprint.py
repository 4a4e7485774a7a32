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
    # 0..137 bytes: empty, the tail alone, whole 64-byte blocks and every tail after them
    # (flipped through a numpy view: torch indexing per bit is minutes under the board's TCG)
    gen = np.random.default_rng(0)
    for length in range(138):
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
    swapped = w.clone()
    swapped[[3, 19]] = swapped[[19, 3]]
    assert _print(swapped.view(torch.uint8)) != base
    assert _print(w.clone().view(torch.uint8)) == base  # other memory, same bytes: same print


def test_ranges_of_zeros_differ_by_length_and_prints_are_per_tensor():
    prints = {_print(torch.zeros(n, dtype=torch.uint8)) for n in range(300)}
    assert len(prints) == 300
    a, b = torch.randn(10), torch.randn(1000)
    both = _C._fingerprints([a.view(torch.uint8), b.view(torch.uint8)])
    assert both == _print(a.view(torch.uint8)) + _print(b.view(torch.uint8))
    assert _C._fingerprints([]) == b""


def test_bad_input_is_refused_by_name():
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
        _C._fingerprints([data])
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

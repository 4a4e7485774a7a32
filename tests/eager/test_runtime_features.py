"""Memory stats, streams, events, RNG and the accelerator API of the flagos device."""

import os

import pytest
import torch

import torch_fl


@pytest.mark.board
def test_memory_stats_track_allocations():
    torch.flagos.empty_cache()
    torch.flagos.reset_peak_memory_stats()
    base = torch.flagos.memory_allocated()
    t = torch.empty(1 << 20, dtype=torch.uint8, device="flagos")
    assert torch.flagos.memory_allocated() - base >= 1 << 20
    assert torch.flagos.max_memory_allocated() >= torch.flagos.memory_allocated()
    assert torch.flagos.memory_reserved() >= torch.flagos.memory_allocated()
    del t
    assert torch.flagos.memory_allocated() == base
    reserved = torch.flagos.memory_reserved()
    assert reserved >= 1 << 20, "a freed block stays cached"
    t2 = torch.empty(1 << 20, dtype=torch.uint8, device="flagos")
    assert torch.flagos.memory_reserved() == reserved, "the cached block must be reused"
    del t2
    torch.flagos.empty_cache()
    assert torch.flagos.memory_reserved() < reserved
    torch.flagos.reset_peak_memory_stats()
    assert torch.flagos.max_memory_allocated() == torch.flagos.memory_allocated()


def test_fallback_results_are_accounted():
    torch.flagos.empty_cache()
    base = torch.flagos.memory_allocated()
    a = torch.ones(1000, device="flagos")
    b = a * 2  # produced by the CPU kernel, then owned by the device
    assert torch.flagos.memory_allocated() >= base + 2 * 4000
    del a, b
    assert torch.flagos.memory_allocated() == base


@pytest.mark.board
def test_host_memory_blocks_are_whole_pages_of_this_kernel():
    """Host-backed device memory comes in pages of the running kernel (4 KB here, 64 KB on the
    S600 and the emulated board), and CPU fallbacks work in it in place (zero-copy)."""
    page = os.sysconf("SC_PAGE_SIZE")
    assert torch_fl.build_info()["page_size"] == page
    if torch.flagos.memory_backend() != "host":
        pytest.skip("UCP memory: its alignment is the vendor runtime's")
    for size in (1, page // 4 + 3, page + 1, 3 * page):
        t = torch.empty(size, dtype=torch.uint8, device="flagos")
        assert t.data_ptr() % page == 0, (size, hex(t.data_ptr()))
    x = torch.arange(page, dtype=torch.float32, device="flagos")
    before = x.data_ptr()
    x.mul_(2)  # a CPU fallback that writes into the device tensor's own pages
    assert x.data_ptr() == before
    assert torch.equal(x.cpu(), torch.arange(page, dtype=torch.float32) * 2)


@pytest.mark.board
def test_streams_have_distinct_ids_and_can_be_made_current():
    s1, s2 = torch.flagos.Stream(), torch.flagos.Stream()
    assert s1.stream_id != s2.stream_id
    assert 0 not in (s1.stream_id, s2.stream_id), "0 is the default stream"
    assert torch.flagos.current_stream().stream_id == 0
    with torch.flagos.stream(s2):
        assert torch.flagos.current_stream().stream_id == s2.stream_id
        assert torch.accelerator.current_stream().stream_id == s2.stream_id
    assert torch.flagos.current_stream().stream_id == 0
    torch.flagos.synchronize()
    s1.synchronize()


@pytest.mark.board
def test_events_measure_real_time():
    import time

    start, end = torch.flagos.Event(), torch.flagos.Event()
    start.record()
    time.sleep(0.02)
    end.record()
    end.synchronize()
    elapsed = start.elapsed_time(end)
    assert 15.0 <= elapsed < 2000.0, elapsed
    assert end.query()


def test_rng_reproducible_and_seedable():
    torch.manual_seed(123)
    a = torch.randn(8, device="flagos")
    torch.manual_seed(123)
    b = torch.randn(8, device="flagos")
    assert torch.equal(a.cpu(), b.cpu())
    torch.flagos.manual_seed(5)
    state = torch.flagos.get_rng_state()
    c = torch.rand(4, device="flagos")
    torch.flagos.set_rng_state(state)
    d = torch.rand(4, device="flagos")
    assert torch.equal(c.cpu(), d.cpu())
    assert not torch.equal(a.cpu()[:4], c.cpu())
    g = torch.Generator(device="flagos")
    g.manual_seed(9)
    e = torch.rand(4, device="flagos", generator=g)
    g.manual_seed(9)
    f = torch.rand(4, device="flagos", generator=g)
    assert torch.equal(e.cpu(), f.cpu())
    assert torch.flagos.initial_seed() == 5


def test_dropout_uses_device_generator():
    x = torch.ones(1000, device="flagos")
    torch.manual_seed(0)
    y1 = torch.nn.functional.dropout(x, 0.5)
    torch.manual_seed(0)
    y2 = torch.nn.functional.dropout(x, 0.5)
    assert torch.equal(y1.cpu(), y2.cpu())
    assert 300 < int((y1 == 0).sum()) < 700


def test_accelerator_api_and_device_module():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator().type == "flagos"
    assert torch.accelerator.device_count() == 1
    assert torch.flagos.device_count() == 1
    assert torch.flagos.current_device() == 0
    with torch.flagos.device(0):
        assert torch.flagos.current_device() == 0
    assert torch.ones(2).flagos().is_flagos
    with pytest.raises(ValueError, match="expected a flagos device"):
        torch.flagos.memory_allocated("cpu")


@pytest.mark.board
def test_pin_memory():
    pinned = torch.randn(16).pin_memory()
    assert pinned.is_pinned()
    assert torch.equal(pinned.to("flagos").cpu(), pinned)


@pytest.mark.board
def test_build_info_and_backend():
    info = torch_fl.build_info()
    assert info["accelerator"] == "bpu"
    assert info["torch_built_against"] == torch.__version__.split("+")[0]
    assert info["memory_backend"] in ("host", "ucp")
    assert info["memory_backend"] == torch.flagos.memory_backend()
    assert info["fallback_mode"] == "zero-copy"


def test_fallback_mode_switch_and_validation():
    a = torch.arange(6.0).to("flagos")
    torch_fl._C._set_fallback_mode("copy")
    try:
        copied = (a * 3).cpu()
    finally:
        torch_fl._C._set_fallback_mode("zero-copy")
    assert torch.equal(copied, torch.arange(6.0) * 3)
    with pytest.raises(RuntimeError, match="valid modes are 'zero-copy'"):
        torch_fl._C._set_fallback_mode("fast")

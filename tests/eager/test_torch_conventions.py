"""What torch.cuda users reach for first, on flagos: torch.accelerator memory calls, autocast,
torch.OutOfMemoryError, the device-module helpers, and a clean `torch.flagos` namespace."""

import types

import pytest
import torch

import torch_fl
from tests.eager.parity import DEV


@pytest.mark.board
def test_accelerator_memory_calls_follow_allocations() -> None:
    torch.accelerator.empty_cache()
    torch.accelerator.reset_peak_memory_stats()
    base = torch.accelerator.memory_allocated()
    t = torch.empty(3 << 20, dtype=torch.uint8, device=DEV)
    assert torch.accelerator.memory_allocated() - base >= 3 << 20
    assert torch.accelerator.max_memory_allocated() >= torch.accelerator.memory_allocated()
    assert torch.accelerator.memory_reserved() >= torch.accelerator.memory_allocated()
    stats = torch.accelerator.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.accelerator.memory_allocated()
    assert stats["allocated_bytes.large_pool.current"] >= 3 << 20
    assert stats["allocation.all.current"] >= 1
    del t
    assert torch.accelerator.memory_allocated() == base
    torch.accelerator.empty_cache()
    assert torch.accelerator.memory_reserved() == torch.accelerator.memory_allocated()
    torch.accelerator.reset_accumulated_memory_stats()
    assert torch.accelerator.memory_stats()["allocated_bytes.all.freed"] == 0
    assert torch.flagos.memory_stats() == dict(torch.accelerator.memory_stats())


def test_memory_info_and_properties() -> None:
    free, total = torch.accelerator.get_memory_info()
    assert 0 < free <= total
    assert torch.flagos.mem_get_info()[1] == total
    props = torch.flagos.get_device_properties()
    assert props.total_memory == total
    assert props.memory_backend == torch.flagos.memory_backend()
    assert props.name == torch.flagos.get_device_name() == torch.flagos.get_device_name(0)
    assert "BPU" in props.name
    with pytest.raises(ValueError, match="expected a flagos device"):
        torch.flagos.get_device_properties("cpu")


def test_memory_summary_is_a_table_of_the_stats() -> None:
    t = torch.empty(1 << 20, dtype=torch.uint8, device=DEV)
    summary = torch.flagos.memory_summary()
    assert "Allocated memory" in summary and "Reserved memory" in summary
    assert "Allocations" not in torch.flagos.memory_summary(abbreviated=True)
    del t


def test_out_of_memory_raises_torch_out_of_memory_error() -> None:
    with pytest.raises(torch.OutOfMemoryError, match="flagos: out of memory"):
        torch.empty(1 << 50, dtype=torch.uint8, device=DEV)
    assert torch.accelerator.memory_stats()["num_ooms"] >= 1
    # The allocator still works afterwards.
    assert torch.ones(4, device=DEV).sum().item() == 4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_casts_matmuls_and_keeps_sensitive_ops_in_float32(dtype: torch.dtype) -> None:
    a = torch.randn(8, 8, device=DEV)
    b = torch.randn(8, 8, device=DEV)
    assert torch.amp.is_autocast_available("flagos")
    with torch.autocast("flagos", dtype=dtype):
        mm = a @ b
        lin = torch.nn.functional.linear(a, b)
        soft = torch.softmax(mm, dim=-1)
        summed = mm.sum()
    assert mm.dtype == dtype and lin.dtype == dtype
    assert soft.dtype == torch.float32 and summed.dtype == torch.float32
    assert mm.device.type == "flagos"
    want = (a.cpu().to(dtype) @ b.cpu().to(dtype)).float()
    torch.testing.assert_close(mm.float().cpu(), want)
    assert (a @ b).dtype == torch.float32, "autocast ends with its block"


def test_autocast_training_step_backward() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model = model.to(DEV)
    x = torch.randn(5, 4, device=DEV)
    with torch.autocast("flagos", dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    loss.backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())


def test_stream_context_and_seed_all() -> None:
    s = torch.flagos.Stream()
    with torch.flagos.StreamContext(s) as entered:
        assert entered is s
        assert torch.flagos.current_stream().stream_id == s.stream_id
    assert torch.flagos.current_stream().stream_id == 0
    with torch.flagos.StreamContext(None):
        assert torch.flagos.current_stream().stream_id == 0
    with pytest.raises(ValueError, match="expected a flagos stream"):
        torch.flagos.StreamContext(torch.Stream("cpu"))
    torch.flagos.seed_all()
    first = torch.flagos.initial_seed()
    torch.flagos.seed_all()
    assert torch.flagos.initial_seed() != first


def test_torch_flagos_has_only_its_api_and_torch_hooks() -> None:
    mod = torch.flagos
    names = {n for n in vars(mod) if not n.startswith("__")}
    private = {n for n in names if n.startswith("_")}
    assert private == {"_lazy_init", "_is_in_bad_fork", "_get_generator"}, private
    assert names - private == set(mod.__all__)
    for leaked in ("Any", "Iterator", "contextlib", "annotations", "torch", "_C", "_index"):
        assert not hasattr(mod, leaked), leaked
    assert not any(isinstance(getattr(mod, n), types.ModuleType) for n in names)
    assert torch_fl.DEVICE_TYPE == "flagos"
    assert mod._get_generator(torch.device("flagos", 0)).device.type == "flagos"


@pytest.mark.parametrize(
    ("device", "error", "match"),
    [
        (5, ValueError, "index 5 is out of range"),
        ("flagos:3", ValueError, "index 3 is out of range"),
        (-1, ValueError, "out of range"),
        ("cuda:0", ValueError, "expected a flagos device"),
        (1.5, TypeError, "expected a flagos device"),
        (True, TypeError, "expected a flagos device"),
    ],
)
def test_bad_device_arguments_are_named(device: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        torch.flagos.get_device_properties(device)
    with pytest.raises(error, match=match):
        torch.flagos.memory_allocated(device)


def test_stream_context_rejects_non_streams() -> None:
    with pytest.raises(TypeError, match="expected a torch.Stream or None"):
        torch.flagos.StreamContext("default")

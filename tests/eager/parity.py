"""Helpers for eager-parity tests: move to flagos, compare with the CPU."""

import torch

import torch_fl  # noqa: F401 - registers the flagos device

DEV = torch.device("flagos")


def on_device(t: torch.Tensor) -> torch.Tensor:
    return t.to(DEV)


def assert_parity(
    device_result: torch.Tensor, cpu_result: torch.Tensor, exact: bool = True
) -> None:
    assert device_result.device.type == "flagos", f"result left the device: {device_result.device}"
    got = device_result.cpu()
    assert got.dtype == cpu_result.dtype
    assert got.shape == cpu_result.shape
    if exact:
        assert torch.equal(got, cpu_result), (got, cpu_result)
    else:
        torch.testing.assert_close(got, cpu_result)

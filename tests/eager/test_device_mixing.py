"""Mixing CPU and flagos tensors in one op follows CUDA's rule (docs/architecture.md):
0-dim CPU tensors are scalars and mix freely; any other CPU tensor is a device-mismatch error
naming both devices. Copies, and the host-side arguments CUDA also takes on the CPU (indices,
packed-sequence lengths), are the exceptions."""

from collections.abc import Callable

import pytest
import torch

from tests.eager.parity import DEV

MISMATCH = r"same device.*flagos:0 and cpu"


def d(*shape: int) -> torch.Tensor:
    return torch.ones(*shape, device=DEV)


def c(*shape: int) -> torch.Tensor:
    return torch.ones(*shape)


REFUSED: dict[str, Callable[[], object]] = {
    "add": lambda: d(2) + c(2),
    "add_cpu_first": lambda: c(2) + d(2),
    "mul_inplace": lambda: d(2).mul_(c(2)),
    "mm": lambda: torch.mm(d(2, 2), c(2, 2)),
    "matmul": lambda: d(2, 2) @ c(2, 2),
    "bmm": lambda: torch.bmm(c(1, 2, 2), d(1, 2, 2)),
    "cat": lambda: torch.cat([d(2), c(2)]),
    "stack": lambda: torch.stack([c(2), d(2)]),
    "where_other": lambda: torch.where(d(2) > 0, c(2), d(2)),
    "where_cond": lambda: torch.where(c(2) > 0, d(2), d(2)),
    "out_cpu": lambda: torch.add(d(2), d(2), out=c(2)),
    "out_cpu_0dim": lambda: torch.sum(d(2), dim=0, out=torch.tensor(0.0)),
    "out_flagos_inputs_cpu": lambda: torch.add(c(2), c(2), out=d(2)),
    "index_select": lambda: torch.index_select(d(3), 0, torch.tensor([0, 2])),
    "gather": lambda: torch.gather(d(3), 0, torch.tensor([0, 1])),
    "masked_fill_mask": lambda: d(2).masked_fill(c(2) > 0, 0.0),
    "linear_weight": lambda: torch.nn.functional.linear(d(2, 3), c(4, 3)),
    "conv_weight": lambda: torch.nn.functional.conv1d(d(1, 1, 5), c(1, 1, 3)),
    "embedding_indices": lambda: torch.nn.functional.embedding(torch.tensor([0]), d(3, 2)),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_non_scalar_cpu_tensors_are_refused(name: str) -> None:
    with pytest.raises(RuntimeError, match=MISMATCH):
        REFUSED[name]()


def test_error_names_the_op_and_argument() -> None:
    with pytest.raises(RuntimeError, match=r"aten::mm: argument 'mat2' is a 2-dim tensor on cpu"):
        torch.mm(d(2, 2), c(2, 2))
    with pytest.raises(RuntimeError, match=r"argument 'out' is a 1-dim output tensor on cpu"):
        torch.add(d(2), d(2), out=c(2))


ALLOWED: dict[str, Callable[[], torch.Tensor]] = {
    "add_cpu_scalar": lambda: d(2) + torch.tensor(2.0),
    "mul_cpu_scalar_first": lambda: torch.tensor(3.0) * d(2),
    "where_cpu_scalar": lambda: torch.where(d(2) > 0, torch.tensor(5.0), d(2)),
    "addcmul_cpu_scalar": lambda: torch.addcmul(d(2), d(2), torch.tensor(2.0)),
    "inplace_cpu_scalar": lambda: d(2).add_(torch.tensor(1.0)),
    "index_with_cpu_indices": lambda: d(4)[torch.tensor([0, 3])],
    "index_with_cpu_mask": lambda: d(3)[torch.tensor([True, False, True])],
    "index_put_cpu_indices": lambda: d(3).index_put_((torch.tensor([1]),), d(1)),
    "setitem_from_cpu": lambda: _setitem(),
    "copy_from_cpu": lambda: d(2).copy_(c(2)),
}


def _setitem() -> torch.Tensor:
    t = d(4)
    t[1:3] = c(2) * 7
    return t


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_cpu_scalars_copies_and_host_indices_are_allowed(name: str) -> None:
    result = ALLOWED[name]()
    assert result.device.type == "flagos"


def test_cpu_scalar_values_are_used() -> None:
    assert torch.equal((d(2) + torch.tensor(2.0)).cpu(), torch.full((2,), 3.0))
    assert torch.equal(_setitem().cpu(), torch.tensor([1.0, 7.0, 7.0, 1.0]))


def test_factories_and_conversions_still_cross_devices() -> None:
    assert torch.zeros_like(c(2), device=DEV).device.type == "flagos"
    assert torch.tensor([1.0, 2.0], device=DEV).device.type == "flagos"
    assert torch.as_tensor(c(3), device=DEV).device.type == "flagos"
    assert d(2).to("cpu").device.type == "cpu"


def test_only_the_index_argument_of_index_ops_may_stay_on_the_cpu() -> None:
    with pytest.raises(RuntimeError, match=r"index_put_impl_: argument 'values'"):
        d(3).index_put_((torch.tensor([1]),), c(1, 1).view(1))

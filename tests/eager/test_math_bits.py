"""Conjugate and negative views (`z.conj()`, `z.conj().imag`, `torch._neg_view`) on flagos.

Their bits must survive every road through the device: copies to and from the CPU, the CPU
fallback (including the CPU kernels that read the bits themselves, such as mm and dot), views
of views and in-place writes through a conj view. Each case runs the same expression on the
CPU and on flagos and compares.
"""

from collections.abc import Callable

import pytest
import torch

import torch_fl
from tests.eager.parity import DEV


def _complex(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=torch.complex64, generator=g)


def _real(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


Z = _complex(4, 4)
W = _complex(4, 4, seed=1)
B = _complex(2, 3, 3, seed=2)
R = _real(5)

# Each expression takes the operands (moved to the device under test) and returns a tensor.
CASES: dict[str, tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]] = {
    "conj_to_cpu": (lambda z: z.conj(), (Z,)),
    "conj_add_scalar": (lambda z: z.conj() + 1, (Z,)),
    "conj_abs": (lambda z: z.conj().abs(), (Z,)),
    "conj_sum": (lambda z: z.conj().sum(), (Z,)),
    "conj_mul_tensor": (lambda z, w: z.conj() * w, (Z, W)),
    "conj_imag": (lambda z: z.conj().imag, (Z,)),
    "conj_real": (lambda z: z.conj().real, (Z,)),
    "conj_imag_plus_one": (lambda z: z.conj().imag + 1, (Z,)),
    "conj_of_view": (lambda z: z[1:, ::2].conj().t(), (Z,)),
    "conj_clone": (lambda z: z.conj().clone(), (Z,)),
    "conj_resolve": (lambda z: z.conj().resolve_conj(), (Z,)),
    "conj_contiguous_t": (lambda z: z.conj().t().contiguous(), (Z,)),
    "mH_matmul": (lambda z: z.mH @ z, (Z,)),
    "conj_mm": (lambda z, w: torch.mm(z.conj(), w), (Z, W)),
    "conj_mm_rhs": (lambda z, w: torch.mm(z, w.conj()), (Z, W)),
    "conj_dot": (lambda z: torch.dot(z[0].conj(), z[0]), (Z,)),
    "vdot": (lambda z, w: torch.vdot(z[0], w[0]), (Z, W)),
    "conj_bmm": (lambda b: torch.bmm(b.conj(), b), (B,)),
    "conj_einsum": (lambda b: torch.einsum("bij,bjk->bik", b.conj(), b), (B,)),
    "conj_matmul_batched": (lambda b: torch.matmul(b.mH, b), (B,)),
    "conj_mv": (lambda z, w: torch.mv(z.conj(), w[0]), (Z, W)),
    "conj_addmm": (lambda z, w: torch.addmm(w, z.conj(), z), (Z, W)),
    "fft_ifft": (lambda z: torch.fft.ifft(z), (Z,)),
    "fft_hfft": (lambda z: torch.fft.hfft(z), (Z,)),
    "fft_ihfft": (lambda r: torch.fft.ihfft(r), (R,)),
    "fft_irfft": (lambda z: torch.fft.irfft(z), (Z,)),
    "neg_view_real": (lambda r: torch._neg_view(r), (R,)),
    "neg_view_real_add": (lambda r: torch._neg_view(r) + 1, (R,)),
    "neg_view_real_dot": (lambda r: torch.dot(torch._neg_view(r), r), (R,)),
    "neg_view_complex": (lambda z: torch._neg_view(z) * 2, (Z,)),
    "neg_and_conj": (lambda z: torch._neg_view(z.conj()) + z, (Z,)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_math_bit_views_match_cpu(name: str) -> None:
    fn, operands = CASES[name]
    expected = fn(*operands)
    got = fn(*(t.to(DEV) for t in operands))
    assert got.device.type == "flagos"
    torch.testing.assert_close(got.cpu(), expected.resolve_conj().resolve_neg())


def test_conj_view_keeps_its_bit_on_the_device() -> None:
    zc = Z.to(DEV).conj()
    assert zc.is_conj()
    assert zc.t().is_conj(), "views of a conj view stay conj"
    assert torch._neg_view(R.to(DEV)).is_neg()
    assert "j" in repr(zc)  # printing goes through the CPU copy of a conj view


def test_item_of_conj_and_neg_views() -> None:
    z = torch.tensor([1 + 2j], dtype=torch.complex64)
    assert z.to(DEV).conj().item() == z.conj().item() == 1 - 2j
    assert torch._neg_view(torch.tensor([3.0]).to(DEV)).item() == -3.0


def test_inplace_through_conj_view_writes_the_base() -> None:
    cpu, dev = Z.clone(), Z.to(DEV)
    cpu.conj().mul_(2 + 1j)
    dev.conj().mul_(2 + 1j)
    torch.testing.assert_close(dev.cpu(), cpu)


def test_copy_into_conj_view() -> None:
    cpu, dev = Z.clone(), Z.to(DEV)
    cpu.conj().copy_(W)
    dev.conj().copy_(W.to(DEV))
    torch.testing.assert_close(dev.cpu(), cpu)
    cpu.conj().copy_(W.conj())
    dev.conj().copy_(W.to(DEV).conj())
    torch.testing.assert_close(dev.cpu(), cpu)


def test_conj_from_cpu_to_device() -> None:
    moved = Z.conj().to(DEV)
    torch.testing.assert_close(moved.cpu(), Z.conj().resolve_conj())


def test_out_argument_that_is_a_conj_view() -> None:
    cpu, dev = torch.zeros_like(Z), torch.zeros_like(Z).to(DEV)
    torch.mm(Z, W, out=cpu.conj())
    torch.mm(Z.to(DEV), W.to(DEV), out=dev.conj())
    torch.testing.assert_close(dev.cpu(), cpu)


@pytest.mark.parametrize(
    "name", ["mH_matmul", "conj_dot", "conj_add_scalar", "conj_abs", "fft_ifft"]
)
def test_copying_fallback_handles_math_bits(name: str) -> None:
    fn, operands = CASES[name]
    torch_fl._C._set_fallback_mode("copy")
    try:
        got = fn(*(t.to(DEV) for t in operands)).cpu()
    finally:
        torch_fl._C._set_fallback_mode("zero-copy")
    torch.testing.assert_close(got, fn(*operands).resolve_conj().resolve_neg())


@pytest.mark.parametrize("adjoint", [False, True])
def test_out_kernel_that_leaves_a_conj_result(adjoint: bool) -> None:
    # linalg_lu_solve(left=False) writes X^H into its output and marks it conj; on flagos the
    # output is the caller's tensor, which must get the bit too (found by the OpInfo suite).
    a = _complex(3, 3, seed=3)
    b = _complex(4, 3, seed=4)
    lu, pivots = torch.linalg.lu_factor(a)
    want = torch.linalg.lu_solve(lu, pivots, b, left=False, adjoint=adjoint)
    got = torch.linalg.lu_solve(lu.to(DEV), pivots.to(DEV), b.to(DEV), left=False, adjoint=adjoint)
    torch.testing.assert_close(got.cpu(), want.resolve_conj())

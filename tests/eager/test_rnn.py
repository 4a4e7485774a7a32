"""Recurrent layers on flagos: forward and backward match the CPU.

ATen sends every non-CPU input of nn.LSTM / nn.GRU / their cells to the fused cell ops, which
only CUDA implements; flagos provides them (csrc/aten/rnn_cells.cpp).
"""

import copy

import pytest
import torch

from tests.eager.parity import DEV

TOL = {"rtol": 1e-4, "atol": 1e-5}


def _run(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]):
    """Forward, a scalar loss over every output, backward: (outputs, input grads, param grads)."""
    inputs = tuple(t.detach().clone().requires_grad_(True) for t in inputs)
    out = module(*inputs)
    flat = []
    for o in out if isinstance(out, tuple) else (out,):
        flat.extend(o if isinstance(o, tuple) else (o,))
    loss = sum((o.float() * (i + 1)).sum() for i, o in enumerate(flat))
    loss.backward()
    params = [p.grad for p in module.parameters()]
    return flat, [t.grad for t in inputs], params


def _compare(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    torch.manual_seed(0)
    on_dev = copy.deepcopy(module).to(DEV)
    cpu_out, cpu_in_grads, cpu_param_grads = _run(module, inputs)
    dev_out, dev_in_grads, dev_param_grads = _run(on_dev, tuple(t.to(DEV) for t in inputs))
    for got, want in zip(dev_out, cpu_out, strict=True):
        assert got.device.type == "flagos"
        torch.testing.assert_close(got.cpu(), want, **TOL)
    for got, want in zip(
        dev_in_grads + dev_param_grads, cpu_in_grads + cpu_param_grads, strict=True
    ):
        assert got is not None and want is not None
        assert got.device.type == "flagos"
        torch.testing.assert_close(got.cpu(), want, **TOL)


@pytest.mark.parametrize("layer", [torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_recurrent_layers(layer: type, bidirectional: bool) -> None:
    torch.manual_seed(0)
    module = layer(4, 6, num_layers=2, bidirectional=bidirectional, batch_first=True)
    _compare(module, (torch.randn(3, 5, 4),))


@pytest.mark.parametrize("layer", [torch.nn.LSTM, torch.nn.GRU])
def test_recurrent_layer_with_initial_state_and_no_bias(layer: type) -> None:
    torch.manual_seed(1)
    module = layer(3, 5, bias=False)
    x = torch.randn(4, 2, 3)
    h0 = torch.randn(1, 2, 5)
    state = (h0, torch.randn(1, 2, 5)) if layer is torch.nn.LSTM else h0
    cpu_out = module(x, state)
    on_dev = copy.deepcopy(module).to(DEV)
    dev_state = tuple(s.to(DEV) for s in state) if isinstance(state, tuple) else state.to(DEV)
    dev_out = on_dev(x.to(DEV), dev_state)
    torch.testing.assert_close(dev_out[0].cpu(), cpu_out[0], **TOL)


def test_lstm_cell() -> None:
    torch.manual_seed(2)
    _compare(torch.nn.LSTMCell(4, 5), (torch.randn(3, 4),))


def test_gru_cell() -> None:
    torch.manual_seed(3)
    _compare(torch.nn.GRUCell(4, 5), (torch.randn(3, 4),))


def test_unbatched_cell_input() -> None:
    torch.manual_seed(4)
    _compare(torch.nn.GRUCell(4, 5), (torch.randn(4),))


def test_packed_sequence_lstm() -> None:
    torch.manual_seed(5)
    module = torch.nn.LSTM(3, 4, batch_first=True)
    x = torch.randn(3, 5, 3)
    lengths = torch.tensor([5, 3, 2])  # lengths stay on the CPU, as PyTorch requires
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True)
    want, _ = torch.nn.utils.rnn.pad_packed_sequence(module(packed)[0], batch_first=True)
    on_dev = copy.deepcopy(module).to(DEV)
    packed_dev = torch.nn.utils.rnn.pack_padded_sequence(x.to(DEV), lengths, batch_first=True)
    got, _ = torch.nn.utils.rnn.pad_packed_sequence(on_dev(packed_dev)[0], batch_first=True)
    torch.testing.assert_close(got.cpu(), want, **TOL)


def test_lstm_under_inference_mode() -> None:
    torch.manual_seed(6)
    module = torch.nn.LSTM(3, 4)
    x = torch.randn(2, 2, 3)
    with torch.inference_mode():
        want = module(x)[0]
        got = copy.deepcopy(module).to(DEV)(x.to(DEV))[0]
    torch.testing.assert_close(got.cpu(), want, **TOL)

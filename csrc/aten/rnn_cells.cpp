// The fused LSTM and GRU cells. ATen's recurrent layers (nn.LSTM, nn.GRU, nn.LSTMCell,
// nn.GRUCell) call `_thnn_fused_lstm_cell` / `_thnn_fused_gru_cell` for every non-CPU input, and
// those ops only have CUDA kernels: the CPU fallback has nothing to run. Here each cell is written
// with ordinary ATen ops. Registered for AutogradPrivateUse1 as well, so autograd differentiates
// those ops instead of calling the CUDA-only fused backward.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace torch_fl {
namespace {

at::Tensor with_bias(const at::Tensor& gates, const std::optional<at::Tensor>& bias) {
  return bias.has_value() && bias->defined() ? gates + *bias : gates;
}

// Gates are (batch, 4 * hidden) in the order input, forget, cell, output, as in the CPU path.
// The third result, a workspace for CUDA's fused backward, is unused elsewhere: the summed gates.
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  const at::Tensor gates = with_bias(with_bias(input_gates + hidden_gates, input_bias), hidden_bias);
  const auto chunks = gates.chunk(4, 1);
  const at::Tensor in_gate = chunks[0].sigmoid();
  const at::Tensor forget_gate = chunks[1].sigmoid();
  const at::Tensor cell_gate = chunks[2].tanh();
  const at::Tensor out_gate = chunks[3].sigmoid();
  at::Tensor cy = forget_gate * cx + in_gate * cell_gate;
  at::Tensor hy = out_gate * cy.tanh();
  return {std::move(hy), std::move(cy), gates};
}

// Gates are (batch, 3 * hidden) in the order reset, update, new. The second result is CUDA's
// backward workspace, unused elsewhere: the input-side gates.
std::tuple<at::Tensor, at::Tensor> fused_gru_cell(const at::Tensor& input_gates,
                                                  const at::Tensor& hidden_gates,
                                                  const at::Tensor& hx,
                                                  const std::optional<at::Tensor>& input_bias,
                                                  const std::optional<at::Tensor>& hidden_bias) {
  const at::Tensor igates = with_bias(input_gates, input_bias);
  const at::Tensor hgates = with_bias(hidden_gates, hidden_bias);
  const auto i = igates.chunk(3, 1);
  const auto h = hgates.chunk(3, 1);
  const at::Tensor reset_gate = (i[0] + h[0]).sigmoid();
  const at::Tensor update_gate = (i[1] + h[1]).sigmoid();
  const at::Tensor new_gate = (i[2] + reset_gate * h[2]).tanh();
  at::Tensor hy = new_gate + update_gate * (hx - new_gate);
  return {std::move(hy), igates};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(fused_lstm_cell));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(fused_gru_cell));
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(fused_lstm_cell));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(fused_gru_cell));
}

}  // namespace torch_fl

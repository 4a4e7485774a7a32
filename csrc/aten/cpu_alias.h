// CPU views of flagos memory, and flagos tensors made from CPU results.
//
// Device memory is host-mapped (UCP) or host memory, so the CPU can work on it in place: a CPU
// "alias" tensor points at the same bytes with the same sizes, strides, offset and conjugate /
// negative bits. This is what makes the CPU fallback zero-copy, and what lets the CPU kernels that
// read those bits themselves (mm, dot, copy_, ...) see a conj or neg view for what it is.
#pragma once

#include <ATen/core/Tensor.h>

namespace torch_fl {

// A CPU tensor over the same bytes as `t` (a flagos tensor). Its storage is resizable through
// the CPU allocator so out= kernels that must resize their output still work (the caller then
// moves the result back, see adopt_resized_out).
at::Tensor cpu_alias(const at::Tensor& t);

// A flagos tensor holding the values of a CPU tensor the fallback just produced. On host memory
// the CPU storage is adopted as it is (no copy); on UCP memory the BPU can only read UCP blocks,
// so the values are copied into a fresh block and the cache is cleaned.
at::Tensor to_device_result(const at::Tensor& cpu, c10::Device device);

// A flagos tensor viewing `base`'s storage with the geometry of `cpu_view` (which views the CPU
// alias of `base`).
at::Tensor device_view_like(const at::Tensor& base, const at::Tensor& cpu_view);

bool is_flagos(const at::Tensor& t);

}  // namespace torch_fl

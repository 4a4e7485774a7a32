// The kernels a PrivateUse1 backend must provide itself. Everything else falls back to the CPU
// (aten/cpu_fallback.cpp). Without empty_strided or _copy_from the fallback recurses until the
// stack overflows; without view/as_strided writes through views are silently lost; and
// convolution has a built-in kernel that throws, which beats any fallback, so it needs its own.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <torch/library.h>

#include <initializer_list>
#include <utility>

#include "aten/cpu_alias.h"
#include "runtime/caching_allocator.h"
#include "runtime/device_guard.h"

namespace torch_fl {
namespace {

constexpr auto kKeys = c10::DispatchKey::PrivateUse1;

void check_device(std::optional<c10::Device> device) {
  if (device.has_value() && device->has_index()) {
    TORCH_CHECK(device->index() < kDeviceCount, "flagos: device ", *device,
                " does not exist; use device 'flagos' or 'flagos:0'");
  }
}

at::Tensor empty_memory_format(at::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> /*pin_memory*/,
                               std::optional<at::MemoryFormat> memory_format) {
  check_device(device);
  TORCH_CHECK(!layout.has_value() || *layout == at::kStrided,
              "flagos: only strided tensors are supported, got layout ", *layout);
  return at::detail::empty_generic(size, &allocator(), c10::DispatchKeySet(kKeys),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(at::IntArrayRef size, at::IntArrayRef stride,
                         std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                         std::optional<at::Device> device, std::optional<bool> /*pin_memory*/) {
  check_device(device);
  TORCH_CHECK(!layout.has_value() || *layout == at::kStrided,
              "flagos: only strided tensors are supported, got layout ", *layout);
  return at::detail::empty_strided_generic(size, stride, &allocator(),
                                           c10::DispatchKeySet(kKeys), c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, at::IntArrayRef size, at::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, at::IntArrayRef size) {
  return at::native::view(self, size);
}

at::Tensor reshape_alias(const at::Tensor& self, at::IntArrayRef size, at::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

const at::Tensor& resize_(const at::Tensor& self, at::IntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  at::native::resize_impl_cpu_(impl, size, std::nullopt, /*resize_storage=*/false);
  if (memory_format.has_value()) {
    TORCH_CHECK(*memory_format != at::MemoryFormat::Preserve,
                "flagos: resize_ does not support memory_format=torch.preserve_format");
    impl->empty_tensor_restride(*memory_format);
  }
  if (impl->numel() > 0) {
    const size_t needed = at::detail::computeStorageNbytes(
        self.sizes(), self.strides(), self.dtype().itemsize(), self.storage_offset());
    if (needed > self.storage().nbytes()) {
      resize_storage_bytes(self.storage().unsafeGetStorageImpl(), needed);
    }
  }
  return self;
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  for (const at::Tensor* t : {&self, &dst}) {
    TORCH_CHECK(is_flagos(*t) || t->device().is_cpu(), "flagos: cannot copy between ",
                self.device(), " and ", dst.device(), "; move the tensor to the CPU first");
  }
  at::Tensor src_cpu = self;
  if (is_flagos(self)) {
    flush_for_cpu_read(self.storage().data_ptr());
    src_cpu = cpu_alias(self);
  }
  at::Tensor dst_cpu = is_flagos(dst) ? cpu_alias(dst) : dst;
  dst_cpu.copy_(src_cpu);
  if (is_flagos(dst)) {
    flush_after_cpu_write(dst.storage().data_ptr());
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  flush_for_cpu_read(self.storage().data_ptr());
  return at::_local_scalar_dense(cpu_alias(self));
}

at::Tensor& set_storage_offset(at::Tensor& self, at::Storage source, int64_t offset,
                               at::IntArrayRef size, at::IntArrayRef stride) {
  at::native::checkSetStorage(self, source, offset, size, stride);
  self.unsafeGetTensorImpl()->set_storage_offset(offset);
  at::OptionalIntArrayRef stride_opt =
      stride.data() != nullptr ? at::OptionalIntArrayRef(stride) : std::nullopt;
  at::native::resize_impl_cpu_(self.unsafeGetTensorImpl(), size, stride_opt,
                               /*resize_storage=*/false);
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, at::Storage source) {
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage_offset(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  return set_storage_offset(self, source.storage(), source.storage_offset(), source.sizes(),
                            source.strides());
}

// Convolution runs on CPU views of the operands: the result is the CPU kernel's, bit for bit.
std::optional<at::Tensor> cpu_optional(const std::optional<at::Tensor>& t) {
  if (!t.has_value() || !t->defined()) {
    return t;
  }
  flush_for_cpu_read(t->storage().data_ptr());
  return cpu_alias(*t);
}

at::Tensor cpu_operand(const at::Tensor& t) {
  flush_for_cpu_read(t.storage().data_ptr());
  return cpu_alias(t);
}

at::Tensor maybe_to_device(const at::Tensor& t, c10::Device device) {
  return t.defined() ? to_device_result(t, device) : t;
}

// The same device rule as the CPU fallback (cpu_fallback.cpp): convolution has no CPU scalars.
void check_on_device(const char* op, std::initializer_list<std::pair<const char*, const at::Tensor*>> args) {
  for (const auto& [name, t] : args) {
    TORCH_CHECK(!t->defined() || is_flagos(*t),
                "Expected all tensors to be on the same device, but found at least two devices, ",
                c10::Device(c10::DeviceType::PrivateUse1, current_device()), " and ", t->device(),
                "! (", op, ": argument '", name, "' is a ", t->dim(), "-dim tensor on ",
                t->device(), "; move it with .to('flagos'), or the others with .cpu())");
  }
}

at::Tensor convolution_overrideable(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                    at::IntArrayRef padding, at::IntArrayRef dilation,
                                    bool transposed, at::IntArrayRef output_padding,
                                    int64_t groups) {
  const at::Tensor no_bias;
  check_on_device("aten::convolution_overrideable",
                  {{"input", &input}, {"weight", &weight}, {"bias", bias ? &*bias : &no_bias}});
  at::Tensor out = at::convolution(cpu_operand(input), cpu_operand(weight), cpu_optional(bias),
                                   stride, padding, dilation, transposed, output_padding, groups);
  return to_device_result(out, input.device());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
    at::IntArrayRef output_padding, int64_t groups, std::array<bool, 3> output_mask) {
  check_on_device("aten::convolution_backward_overrideable",
                  {{"grad_output", &grad_output}, {"input", &input}, {"weight", &weight}});
  std::vector<int64_t> bias_sizes;
  if (output_mask[2]) {
    bias_sizes.push_back(transposed ? weight.size(1) * groups : weight.size(0));
  }
  auto [grad_input, grad_weight, grad_bias] = at::convolution_backward(
      cpu_operand(grad_output), cpu_operand(input), cpu_operand(weight),
      output_mask[2] ? at::OptionalIntArrayRef(bias_sizes) : std::nullopt, stride, padding,
      dilation, transposed, output_padding, groups, output_mask);
  const c10::Device device = input.device();
  return {maybe_to_device(grad_input, device), maybe_to_device(grad_weight, device),
          maybe_to_device(grad_bias, device)};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("as_strided", TORCH_FN(as_strided));
  m.impl("view", TORCH_FN(view));
  m.impl("_reshape_alias", TORCH_FN(reshape_alias));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  m.impl("set_.source_Storage", TORCH_FN(set_source_storage));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage_offset));
  m.impl("set_.source_Tensor", TORCH_FN(set_source_tensor));
  m.impl("convolution_overrideable", TORCH_FN(convolution_overrideable));
  m.impl("convolution_backward_overrideable", TORCH_FN(convolution_backward_overrideable));
}

// A conjugate or negative view reaches `_copy_from` (copies between flagos and the CPU) through
// PyTorch's math-bit fallbacks, which would materialise it with `clone`, itself a `copy_` into a
// flagos tensor and so another `_copy_from`: endless recursion, then a segfault. copy_from above
// handles both bits itself (its CPU aliases carry them and the CPU copy_ resolves them), so the
// fallbacks are skipped for these two ops. Only backends without their own copy_ kernel (flagos
// here) ever call them.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

}  // namespace torch_fl

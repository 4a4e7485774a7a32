#include "aten/cpu_alias.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>

#include "runtime/caching_allocator.h"
#include "runtime/ucp_runtime.h"

namespace torch_fl {
namespace {

// Context of an adopted CPU result: keeps the CPU storage alive while the flagos tensor lives.
struct Adopted {
  c10::Storage cpu_storage;
  int64_t nbytes;
};

void release_adopted(void* ctx) {
  auto* adopted = static_cast<Adopted*>(ctx);
  allocator().note_adopted(-adopted->nbytes);
  delete adopted;
}

// The conjugate and negative bits are part of what a tensor means, not just flags: a conj view
// reads its bytes conjugated. Every tensor made over another one's bytes must carry them over, or
// kernels silently read the unconjugated values.
void copy_math_bits(c10::TensorImpl* impl, const at::Tensor& from) {
  if (from.is_conj()) {
    impl->_set_conj(true);
  }
  if (from.is_neg()) {
    impl->_set_neg(true);
  }
}

at::Tensor make_device_tensor(c10::Storage storage, const at::Tensor& geometry) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), geometry.dtype());
  impl->set_sizes_and_strides(geometry.sizes(), geometry.strides(), geometry.storage_offset());
  copy_math_bits(impl.get(), geometry);
  return at::Tensor(std::move(impl));
}

}  // namespace

bool is_flagos(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
}

at::Tensor cpu_alias(const at::Tensor& t) {
  const c10::Storage& storage = t.storage();
  c10::Storage cpu_storage(
      c10::Storage::use_byte_size_t(), storage.nbytes(),
      at::DataPtr(const_cast<void*>(storage.data()), c10::Device(c10::DeviceType::CPU)),
      c10::GetCPUAllocator(), /*resizable=*/true);
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      std::move(cpu_storage), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  copy_math_bits(impl.get(), t);
  return at::Tensor(std::move(impl));
}

at::Tensor to_device_result(const at::Tensor& cpu, c10::Device device) {
  if (ucp::backend() == ucp::Backend::Host) {
    c10::Storage cpu_storage = cpu.storage();
    const auto nbytes = static_cast<int64_t>(cpu_storage.nbytes());
    auto* adopted = new Adopted{cpu_storage, nbytes};
    allocator().note_adopted(nbytes);
    c10::Storage storage(
        c10::Storage::use_byte_size_t(), cpu_storage.nbytes(),
        at::DataPtr(cpu_storage.mutable_data(), adopted, &release_adopted, device), &allocator(),
        /*resizable=*/true);
    return make_device_tensor(std::move(storage), cpu);
  }
  // The copy below resolves any conjugate/negative bit of `cpu` into the values of `out`.
  at::Tensor out = cpu.is_non_overlapping_and_dense()
      ? at::empty_strided(cpu.sizes(), cpu.strides(), cpu.options().device(device))
      : at::empty(cpu.sizes(), cpu.options().device(device));
  cpu_alias(out).copy_(cpu);
  flush_after_cpu_write(out.storage().data_ptr());
  return out;
}

at::Tensor device_view_like(const at::Tensor& base, const at::Tensor& cpu_view) {
  return make_device_tensor(base.storage(), cpu_view);
}

}  // namespace torch_fl

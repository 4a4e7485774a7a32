#include "aten/cpu_fallback.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/record_function.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <atomic>
#include <optional>

#include "aten/cpu_alias.h"
#include "runtime/caching_allocator.h"
#include "runtime/device_guard.h"
#include "runtime/hooks.h"

namespace torch_fl {
namespace {

std::atomic<bool> g_copy_mode{false};

struct Alias {
  at::Tensor device;
  at::Tensor cpu;
  const void* data;  // the device bytes the CPU alias was made over
  bool written;
};

bool is_generator_arg(const c10::Argument& arg) {
  const c10::TypePtr& type = arg.type();
  if (type->kind() == c10::TypeKind::GeneratorType) {
    return true;
  }
  if (type->kind() == c10::TypeKind::OptionalType) {
    return type->castRaw<c10::OptionalType>()->getElementType()->kind() ==
        c10::TypeKind::GeneratorType;
  }
  return false;
}

// Arguments CUDA also accepts on the CPU next to device tensors: index tensors (x[cpu_index]),
// the lengths / batch sizes of packed sequences and CTC, and the sources of copies.
bool is_host_argument(const c10::OperatorName& op, const std::string& arg) {
  static const std::pair<const char*, const char*> kArgs[] = {
      {"aten::index", "indices"},
      {"aten::index_put", "indices"},
      {"aten::index_put_", "indices"},
      {"aten::_index_put_impl_", "indices"},
      {"aten::_unsafe_index", "indices"},
      {"aten::_unsafe_index_put", "indices"},
      {"aten::_pack_padded_sequence", "lengths"},
      {"aten::_pack_padded_sequence_backward", "batch_sizes"},
      {"aten::_pad_packed_sequence", "batch_sizes"},
      {"aten::_ctc_loss", "input_lengths"},
      {"aten::_ctc_loss", "target_lengths"},
      {"aten::_ctc_loss_backward", "input_lengths"},
      {"aten::_ctc_loss_backward", "target_lengths"},
      {"aten::_foreach_copy_", "src"},  // a copy per pair, and copies may cross devices
  };
  for (const auto& [name, argument] : kArgs) {
    if (op.name == name && arg == argument) {
      return true;
    }
  }
  return false;
}

struct TensorArg {
  at::Tensor tensor;
  size_t index;  // position in the schema's arguments
};

// CUDA's rule for mixing devices in one op: a CPU tensor may join device tensors only as a 0-dim
// read-only value (a "CPU scalar"); anything else is an error naming both devices. The CPU
// fallback would otherwise accept any CPU tensor (its kernel runs on the CPU anyway), so `mm`,
// `cat` or `out=` would silently work where `add` (TensorIterator) refuses.
void check_devices(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& args = op.schema().arguments();
  const size_t begin = stack.size() - args.size();
  c10::SmallVector<TensorArg, 8> tensors;
  std::optional<c10::Device> device;
  auto visit = [&](const at::Tensor& t, size_t i) {
    if (!t.defined()) {
      return;
    }
    if (is_flagos(t) && !device.has_value()) {
      device = t.device();
    }
    tensors.push_back(TensorArg{t, i});
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& value = stack[begin + i];
    if (value.isTensor()) {
      visit(value.toTensor(), i);
    } else if (value.isTensorList()) {
      for (const at::Tensor& t : value.toTensorList()) {
        visit(t, i);
      }
    } else if (value.isOptionalTensorList()) {
      for (const std::optional<at::Tensor>& t : value.toOptionalTensorList()) {
        if (t.has_value()) {
          visit(*t, i);
        }
      }
    }
  }
  if (!device.has_value()) {
    return;
  }
  for (const TensorArg& a : tensors) {
    const at::Tensor& t = a.tensor;
    if (is_flagos(t)) {
      continue;
    }
    const c10::Argument& arg = args[a.index];
    const bool written = arg.alias_info() != nullptr && arg.alias_info()->isWrite();
    if (t.device().is_cpu() && !written &&
        (t.dim() == 0 || is_host_argument(op.schema().operator_name(), arg.name()))) {
      continue;  // a CPU scalar, or a host-side argument, as CUDA allows
    }
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two "
                "devices, ", *device, " and ", t.device(), "! (", op.schema().name(), ": argument '",
                arg.name(), "' is a ", t.dim(), "-dim ", written ? "output " : "", "tensor on ",
                t.device(), "; only 0-dim CPU tensors may be mixed with ", device->type(),
                " tensors. Move it with .to('", device->type(), "'), or the others with .cpu())");
  }
}

class ZeroCopyCall {
 public:
  ZeroCopyCall(const c10::OperatorHandle& op, torch::jit::Stack* stack) : op_(op), stack_(stack) {}

  void run() {
    const auto& args = op_.schema().arguments();
    const size_t begin = stack_->size() - args.size();
    c10::SmallVector<size_t, 2> generator_slots;
    for (size_t i = 0; i < args.size(); ++i) {
      c10::IValue& value = (*stack_)[begin + i];
      const bool written = args[i].alias_info() != nullptr && args[i].alias_info()->isWrite();
      if (value.isTensor()) {
        at::Tensor t = value.toTensor();
        value = to_cpu(t, written);
      } else if (value.isTensorList()) {
        c10::List<at::Tensor> cpu_list;
        for (const at::Tensor& t : value.toTensorList()) {
          cpu_list.push_back(to_cpu(t, written));
        }
        value = std::move(cpu_list);
      } else if (value.isOptionalTensorList()) {
        c10::List<std::optional<at::Tensor>> cpu_list;
        for (const std::optional<at::Tensor>& t : value.toOptionalTensorList()) {
          cpu_list.push_back(t.has_value() ? std::optional<at::Tensor>(to_cpu(*t, written)) : t);
        }
        value = std::move(cpu_list);
      } else if (value.isDevice() && value.toDevice().type() == c10::DeviceType::PrivateUse1) {
        note_device(value.toDevice());
        value = c10::IValue(c10::Device(c10::DeviceType::CPU));
      } else if (is_generator_arg(args[i])) {
        generator_slots.push_back(begin + i);
      }
    }
    // Random ops: the CPU kernel draws from the flagos generator's CPU engine, so seeding flagos
    // (torch.manual_seed / torch.flagos.manual_seed) makes device randomness reproducible.
    if (device_.has_value()) {
      for (size_t slot : generator_slots) {
        c10::IValue& value = (*stack_)[slot];
        if (value.isNone()) {
          value = c10::IValue(cpu_generator_of(default_generator(device_->index())));
        } else if (is_flagos_generator(value.toGenerator())) {
          value = c10::IValue(cpu_generator_of(value.toGenerator()));
        }
      }
    }

    op_.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack_);

    if (!device_.has_value()) {
      return;  // nothing on flagos took part: results are CPU results
    }
    sync_written_aliases();
    const size_t num_returns = op_.schema().returns().size();
    for (size_t i = stack_->size() - num_returns; i < stack_->size(); ++i) {
      c10::IValue& value = (*stack_)[i];
      if (value.isTensor()) {
        value = to_device(value.toTensor());
      } else if (value.isTensorList()) {
        c10::List<at::Tensor> device_list;
        for (const at::Tensor& t : value.toTensorList()) {
          device_list.push_back(to_device(t));
        }
        value = std::move(device_list);
      }
    }
  }

 private:
  void note_device(c10::Device device) {
    if (!device_.has_value()) {
      device_ = device;
    }
  }

  at::Tensor to_cpu(const at::Tensor& t, bool written) {
    if (!is_flagos(t)) {
      return t;
    }
    note_device(t.device());
    flush_for_cpu_read(t.storage().data_ptr());
    at::Tensor alias = cpu_alias(t);
    aliases_.push_back(Alias{t, alias, t.storage().data(), written});
    return alias;
  }

  // out= kernels may resize their output: bring the new geometry (and, if the CPU allocator had
  // to reallocate, the new bytes) back to the flagos tensor the caller holds.
  void sync_written_aliases() {
    for (Alias& a : aliases_) {
      if (!a.written) {
        continue;
      }
      // Some out= kernels leave their result as a conj view of what they wrote (linalg_lu_solve
      // with left=False): the bit belongs to the caller's tensor as much as its strides do.
      at::Tensor bits_from = a.cpu;
      if (a.cpu.storage().data() != a.data) {
        bits_from = to_device_result(a.cpu, *device_);  // resolves the bits when it copies
        a.device.set_(bits_from);
      } else {
        if (a.cpu.sizes() != a.device.sizes() || a.cpu.strides() != a.device.strides() ||
            a.cpu.storage_offset() != a.device.storage_offset()) {
          a.device.unsafeGetTensorImpl()->set_sizes_and_strides(
              a.cpu.sizes(), a.cpu.strides(), a.cpu.storage_offset());
        }
        flush_after_cpu_write(a.device.storage().data_ptr());
      }
      c10::TensorImpl* impl = a.device.unsafeGetTensorImpl();
      if (bits_from.is_conj() != a.device.is_conj()) {
        impl->_set_conj(bits_from.is_conj());
      }
      if (bits_from.is_neg() != a.device.is_neg()) {
        impl->_set_neg(bits_from.is_neg());
      }
    }
  }

  at::Tensor to_device(const at::Tensor& result) {
    if (!result.defined() || result.device().type() != c10::DeviceType::CPU) {
      return result;
    }
    for (const Alias& a : aliases_) {
      if (result.unsafeGetTensorImpl() == a.cpu.unsafeGetTensorImpl()) {
        return a.device;  // in-place or out=: the caller's own tensor
      }
    }
    const void* data = result.storage().data();
    for (const Alias& a : aliases_) {
      if (data != nullptr && data == a.cpu.storage().data()) {
        return device_view_like(a.device, result);  // a view of an input
      }
    }
    return to_device_result(result, *device_);
  }

  const c10::OperatorHandle& op_;
  torch::jit::Stack* stack_;
  std::optional<c10::Device> device_;
  c10::SmallVector<Alias, 4> aliases_;
};

void flagos_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // A profiler range per fallback call, carrying the current stream id as its input so traces
  // (record_shapes=True: "Concrete Inputs") show which stream the work was issued on. The input
  // is only built while a profiler is recording.
  RECORD_FUNCTION("flagos::cpu_fallback",
                  std::vector<c10::IValue>({c10::IValue(current_stream(-1).id())}));
  check_devices(op, *stack);
  if (g_copy_mode.load(std::memory_order_relaxed)) {
    at::native::cpu_fallback(op, stack);
    return;
  }
  ZeroCopyCall(op, stack).run();
}

}  // namespace

void set_fallback_mode(const std::string& mode) {
  TORCH_CHECK(mode == "zero-copy" || mode == "copy", "flagos: unknown fallback mode '", mode,
              "'; valid modes are 'zero-copy' (default) and 'copy'");
  g_copy_mode.store(mode == "copy");
}

std::string fallback_mode() { return g_copy_mode.load() ? "copy" : "zero-copy"; }

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&flagos_fallback>());
}

// These ops have both a CPU kernel and a CompositeExplicitAutograd decomposition, and a backend
// without its own kernel gets the decomposition, not the fallback. Its rounding differs from the
// CPU kernel's (layer_norm over one element returned bias + 1e-4, amplified by rstd), and it
// costs several fallback calls instead of one: send them to the CPU kernel like everything else.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* op : {"native_layer_norm", "native_group_norm", "addr", "addr.out"}) {
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&flagos_fallback>());
  }
}

}  // namespace torch_fl

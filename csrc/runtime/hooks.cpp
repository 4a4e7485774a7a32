#include "runtime/hooks.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/impl/alloc_cpu.h>

#include <mutex>
#include <unordered_set>

#include "runtime/caching_allocator.h"
#include "runtime/device_guard.h"

namespace torch_fl {
namespace {

struct FlagosGenerator final : public c10::GeneratorImpl {
  explicit FlagosGenerator(c10::DeviceIndex index, at::Generator cpu)
      : c10::GeneratorImpl(c10::Device(kType, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        cpu_(std::move(cpu)) {}

  void set_current_seed(uint64_t seed) override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    cpu_.set_current_seed(seed);
  }
  void set_offset(uint64_t offset) override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    cpu_.set_offset(offset);
  }
  uint64_t get_offset() const override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    return cpu_.get_offset();
  }
  uint64_t current_seed() const override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    return cpu_.current_seed();
  }
  uint64_t seed() override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    return cpu_.seed();
  }
  void set_state(const c10::TensorImpl& new_state) override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    cpu_.unsafeGetGeneratorImpl()->set_state(new_state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    return cpu_.unsafeGetGeneratorImpl()->get_state();
  }
  FlagosGenerator* clone_impl() const override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    return new FlagosGenerator(device().index(), cpu_.clone());
  }

  mutable at::Generator cpu_;  // mutable: its mutex is taken in const accessors
};

at::Generator make_flagos_generator(c10::DeviceIndex index) {
  return at::make_generator<FlagosGenerator>(
      index, at::make_generator<at::CPUGeneratorImpl>(c10::default_rng_seed_val));
}

// Pinned host memory: page-aligned host allocations we can recognise. On a board the transfer
// is a memcpy into host-mapped UCP memory either way, so alignment is what matters.
struct PinnedState {
  std::mutex mutex;
  std::unordered_set<const void*> live;
};
PinnedState& pinned_state() {
  static PinnedState* s = new PinnedState();
  return *s;
}

void free_pinned(void* ptr) {
  {
    PinnedState& s = pinned_state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.live.erase(ptr);
  }
  c10::free_cpu(ptr);
}

struct PinnedAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void* ptr = n == 0 ? nullptr : c10::alloc_cpu(n);
    if (ptr != nullptr) {
      PinnedState& s = pinned_state();
      std::lock_guard<std::mutex> lock(s.mutex);
      s.live.insert(ptr);
    }
    return c10::DataPtr(ptr, ptr, &free_pinned, c10::Device(c10::DeviceType::CPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

PinnedAllocator& pinned_allocator() {
  static PinnedAllocator* a = new PinnedAllocator();
  return *a;
}

struct FlagosHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex /*index*/) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return kDeviceCount; }
  void setCurrentDevice(c10::DeviceIndex index) const override { set_device(index); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    c10::DeviceIndex old = current_device();
    set_device(index);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override {
    return exchangeDevice(index);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return make_flagos_generator(index < 0 ? current_device() : index);
  }
  at::Device getDeviceFromPtr(void* /*data*/) const override {
    return c10::Device(kType, current_device());
  }
  bool isPinnedPtr(const void* data) const override {
    PinnedState& s = pinned_state();
    std::lock_guard<std::mutex> lock(s.mutex);
    return s.live.count(data) > 0;
  }
  at::Allocator* getPinnedMemoryAllocator() const override { return &pinned_allocator(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_storage_bytes(storage.unsafeGetStorageImpl(), newsize);
  }
};

struct HooksRegistrar {
  HooksRegistrar() {
    at::RegisterPrivateUse1HooksInterface(new FlagosHooks());
    c10::SetAllocator(kType, &allocator());
  }
};
HooksRegistrar hooks_registrar;

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex index) {
  static std::once_flag once;
  static at::Generator* generators = nullptr;  // leaked with the process
  std::call_once(once, [] {
    generators = new at::Generator[kDeviceCount];
    for (c10::DeviceIndex i = 0; i < kDeviceCount; ++i) {
      generators[i] = make_flagos_generator(i);
    }
  });
  const c10::DeviceIndex idx = index < 0 ? current_device() : index;
  TORCH_CHECK(idx < kDeviceCount, "flagos: no generator for device ", static_cast<int>(idx));
  return generators[idx];
}

bool is_flagos_generator(const at::Generator& generator) {
  return generator.defined() && generator.device().type() == kType;
}

at::Generator cpu_generator_of(const at::Generator& flagos_generator) {
  auto* impl = dynamic_cast<FlagosGenerator*>(flagos_generator.unsafeGetGeneratorImpl());
  TORCH_CHECK(impl != nullptr, "flagos: generator on ", flagos_generator.device(),
              " was not created by torch_fl; create it with torch.Generator(device='flagos')");
  return impl->cpu_;
}

}  // namespace torch_fl

// Device-side timing for torch.profiler / torch.autograd.profiler with use_device="flagos".
//
// PyTorch's PrivateUse1 profiler fallback asks the backend to record an event at the start and
// end of every op and to measure the time between them. Work on flagos is synchronous, so a
// host timestamp taken when the op is recorded is the device timestamp.
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <memory>

#include "runtime/device_guard.h"

namespace torch_fl {
namespace {

using torch::profiler::impl::ProfilerVoidEventStub;

struct FlagosProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    const int64_t now = c10::getTime();
    if (device != nullptr) {
      *device = current_device();
    }
    if (event != nullptr) {
      *event = std::make_shared<int64_t>(now);
    }
    if (cpu_ns != nullptr) {
      *cpu_ns = now;
    }
  }
  float elapsed(const ProfilerVoidEventStub* start,
                const ProfilerVoidEventStub* end) const override {
    const auto a = *static_cast<const int64_t*>(start->get());
    const auto b = *static_cast<const int64_t*>(end->get());
    return static_cast<float>(b - a) / 1000.0f;  // microseconds, as the CUDA stubs report
  }
  void mark(const char* /*name*/) const override {}
  void rangePush(const char* /*name*/) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }
  void onEachDevice(std::function<void(int)> op) const override {
    for (c10::DeviceIndex i = 0; i < kDeviceCount; ++i) {
      op(i);
    }
  }
  void synchronize() const override {}
};

struct ProfilerStubsRegistrar {
  ProfilerStubsRegistrar() {
    static FlagosProfilerStubs* stubs = new FlagosProfilerStubs();  // leaked: see allocator
    torch::profiler::impl::registerPrivateUse1Methods(stubs);
  }
};
ProfilerStubsRegistrar profiler_stubs_registrar;

}  // namespace
}  // namespace torch_fl

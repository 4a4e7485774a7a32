#include "runtime/device_guard.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>

namespace torch_fl {
namespace {

thread_local c10::DeviceIndex tls_device = 0;
// Stream 0 is the default stream; every new stream gets the next id.
thread_local c10::StreamId tls_stream = 0;
std::atomic<c10::StreamId> next_stream_id{1};

struct Event {
  int64_t timestamp_ns = 0;
  bool recorded = false;
  c10::StreamId stream = 0;
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void check_index(c10::DeviceIndex index) {
  TORCH_CHECK(
      index >= 0 && index < kDeviceCount, "flagos: device index ", static_cast<int>(index),
      " is out of range; this board exposes ", static_cast<int>(kDeviceCount),
      " flagos device (its BPU cores are scheduled inside it)");
}

struct FlagosGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kType; }

  c10::Device exchangeDevice(c10::Device d) const override {
    TORCH_INTERNAL_ASSERT(d.type() == kType);
    c10::Device old = getDevice();
    if (d.index() >= 0 && d.index() != old.index()) {
      set_device(d.index());
    }
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kType, current_device()); }
  void setDevice(c10::Device d) const override { set_device(d.index() < 0 ? 0 : d.index()); }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    tls_device = d.index() < 0 ? 0 : d.index();
  }
  c10::Stream getStream(c10::Device d) const override { return current_stream(d.index()); }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, d.index()), 0);
  }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    return new_stream(d.index());
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high_priority*/) const override {
    return new_stream(d.index());
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    c10::Stream old = current_stream(s.device_index());
    tls_stream = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return kDeviceCount; }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex /*device_index*/,
              const c10::EventFlag /*flag*/) const override {
    if (*event == nullptr) {
      *event = new Event();
    }
    auto* e = static_cast<Event*>(*event);
    // Work on the device is synchronous, so "all work before the record is done" holds now.
    e->timestamp_ns = now_ns();
    e->recorded = true;
    e->stream = stream.id();
  }
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* /*event*/) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    delete static_cast<Event*>(event);
  }
  void synchronizeEvent(void* /*event*/) const override {}
  bool queryStream(const c10::Stream& /*stream*/) const override { return true; }
  void synchronizeStream(const c10::Stream& /*stream*/) const override {}
  void synchronizeDevice(const c10::DeviceIndex /*device_index*/) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device_index*/)
      const override {
    TORCH_CHECK(start != nullptr && end != nullptr,
                "flagos: both events must be recorded before elapsed_time(); call "
                "event.record() on each first");
    auto* a = static_cast<Event*>(start);
    auto* b = static_cast<Event*>(end);
    return static_cast<double>(b->timestamp_ns - a->timestamp_ns) / 1e6;  // milliseconds
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, FlagosGuardImpl);

}  // namespace

c10::DeviceIndex current_device() { return tls_device; }

void set_device(c10::DeviceIndex index) {
  check_index(index);
  tls_device = index;
}

c10::Stream current_stream(c10::DeviceIndex index) {
  const c10::DeviceIndex idx = index < 0 ? current_device() : index;
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, idx), tls_stream);
}

c10::Stream new_stream(c10::DeviceIndex index) {
  const c10::DeviceIndex idx = index < 0 ? current_device() : index;
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, idx), next_stream_id++);
}

}  // namespace torch_fl

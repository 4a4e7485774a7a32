// Device, stream and event bookkeeping for `flagos`.
//
// The BPU is one device (its cores are a scheduling detail, not devices), and work submitted to it
// is synchronous from the host's view. Streams are still real objects with distinct ids, so code
// written for CUDA-style streams runs unchanged and profiler traces can tell them apart; events
// carry real host timestamps so `elapsed_time` measures what ran between them.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

namespace torch_fl {

constexpr c10::DeviceIndex kDeviceCount = 1;
// The device type every runtime file registers under (one definition: the build may compile
// several .cpp files as one translation unit, see setup.py).
constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

c10::DeviceIndex current_device();
void set_device(c10::DeviceIndex index);
c10::Stream current_stream(c10::DeviceIndex index);
c10::Stream new_stream(c10::DeviceIndex index);

}  // namespace torch_fl

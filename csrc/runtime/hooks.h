// PrivateUse1 hooks: what PyTorch asks a backend for outside of operator dispatch (generators,
// pinned memory, device queries). Without them backward, torch.Generator and pin_memory fail.
#pragma once

#include <ATen/core/Generator.h>

namespace torch_fl {

// The flagos default generator. Random ops run on the CPU through the fallback, so the generator
// owns a CPU generator that the fallback hands to the CPU kernel: seeding `flagos` reproduces the
// same stream without copying generator state per call.
const at::Generator& default_generator(c10::DeviceIndex index);
at::Generator cpu_generator_of(const at::Generator& flagos_generator);
bool is_flagos_generator(const at::Generator& generator);

}  // namespace torch_fl

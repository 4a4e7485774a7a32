// The board's UCP memory runtime (libhbucp.so), loaded at run time.
//
// No vendor header or library is needed to build: the three entry points the device memory
// needs are resolved with dlopen/dlsym on first use. Where the library is absent (any x86_64
// host, a board without the runtime) device memory is page-aligned host memory instead, and
// `backend()` says which one is in use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace torch_fl::ucp {

// Layout of hbUCPSysMem from hb_ucp_sys.h (see docs/architecture.md).
struct SysMem {
  uint64_t phyAddr;
  void* virAddr;
  uint64_t memSize;
};

enum class Backend { Host, Ucp };

// hbUCPMemFlush flags: invalidate before the CPU reads what the BPU wrote, clean after the CPU
// wrote what the BPU will read.
constexpr int kFlushInvalidate = 1;
constexpr int kFlushClean = 2;

// Set the explicit library path (FLAGOS_BPU_UCP_LIB, read by Python from the environment or the
// provisioning env file). Only effective before the first allocation.
void configure(const std::string& explicit_path);

// Loads the runtime on first call; thread-safe.
Backend backend();
const char* backend_name();
// Path of the loaded library ("" for host memory) and the reason host memory was chosen.
std::string loaded_path();
std::string load_warning();

// Allocate `size` bytes; throws std::runtime_error naming the failing call.
void allocate(size_t size, SysMem* out);
void release(SysMem* mem);
// No-op on host memory.
void flush(SysMem* mem, int flag);

size_t page_size();

}  // namespace torch_fl::ucp

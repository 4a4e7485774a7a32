// Caching allocator for `flagos` device memory.
//
// UCP allocations are expensive syscalls into the BPU driver, so freed blocks are kept in
// size-bucketed free lists and reused. Blocks go back to the runtime only through an explicit
// `empty_cache()`: never from a static destructor, because at process exit libhbucp tears its
// heap down in its own destructors first, and a later hbUCPFree aborts with "double free or
// corruption" (measured on a board; docs/architecture.md).
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/StorageImpl.h>

#include <cstddef>
#include <cstdint>

#include "runtime/ucp_runtime.h"

namespace torch_fl {

// One runtime allocation. The DataPtr context of every tensor the allocator hands out.
struct Block {
  ucp::SysMem mem{};
  size_t size = 0;  // rounded size, the bucket key
};

struct MemoryStats {
  int64_t allocated = 0;       // bytes in blocks handed out (plus adopted CPU results)
  int64_t max_allocated = 0;
  int64_t reserved = 0;        // bytes held (runtime blocks in use + cached, adopted results)
  int64_t max_reserved = 0;
  int64_t alloc_count = 0;     // runtime allocations (cache misses)
  int64_t free_count = 0;      // runtime frees (empty_cache)
  int64_t num_alloc_retries = 0;  // runtime allocations retried after emptying the cache
  int64_t num_ooms = 0;        // allocations that failed even after the retry
};

// A c10::DeviceAllocator, so PyTorch's device-generic memory API (`torch.accelerator.memory_*`,
// `torch.accelerator.get_memory_info`) works on flagos as it does on CUDA.
class CachingAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t mempool_id) override;
  // Work on flagos is synchronous, so a block is free for reuse as soon as its tensor dies.
  void recordStream(const c10::DataPtr& /*ptr*/, c10::Stream /*stream*/) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  // (free, total) bytes of the memory flagos tensors are carved from: see the .cpp.
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;

  // Return every cached (unused) block to the runtime.
  void empty_cache();
  MemoryStats stats() const;
  void reset_peak_stats();

  // Accounting for memory the CPU fallback produced and the device adopted without a copy.
  void note_adopted(int64_t nbytes);

  // The Block behind a DataPtr this allocator produced, or nullptr (e.g. an adopted CPU result).
  static Block* block_of(const c10::DataPtr& ptr);
};

// The process-wide allocator; leaked on purpose (see above).
CachingAllocator& allocator();

// Cache maintenance around CPU access to device memory: no-op unless the UCP runtime is loaded.
void flush_for_cpu_read(const c10::DataPtr& ptr);
void flush_after_cpu_write(const c10::DataPtr& ptr);

}  // namespace torch_fl

namespace torch_fl {
// Grow or shrink a flagos storage in place (new block, copy, swap), with the cache maintenance
// the copy needs. Used by resize_ and by untyped-storage resize.
void resize_storage_bytes(c10::StorageImpl* storage, size_t nbytes);
}  // namespace torch_fl

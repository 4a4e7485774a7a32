#include "runtime/caching_allocator.h"

#include <c10/util/Exception.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace torch_fl {
namespace {

constexpr size_t kSmallRound = 512;             // small tensors share 512 B granules
constexpr size_t kLargeThreshold = 1 << 20;     // above 1 MiB round to 64 KiB (largest page)
constexpr size_t kLargeRound = 64 * 1024;

size_t round_size(size_t n) {
  const size_t unit = n < kLargeThreshold ? kSmallRound : kLargeRound;
  return std::max(unit, ((n + unit - 1) / unit) * unit);
}

using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatArray;
using c10::CachingAllocator::StatType;

struct Pool {
  std::mutex mutex;
  std::unordered_map<size_t, std::vector<Block*>> free_blocks;
  // Byte and count statistics, split like CUDA's into small (< 1 MiB) and large blocks.
  StatArray allocated_bytes;  // handed out (plus adopted CPU results)
  StatArray reserved_bytes;   // held from the runtime (in use + cached, plus adopted results)
  StatArray allocations;      // live tensors' blocks
  StatArray segments;         // runtime blocks held
  int64_t alloc_count = 0;    // runtime allocations (cache misses)
  int64_t free_count = 0;     // runtime frees (empty_cache)
  int64_t alloc_retries = 0;
  int64_t ooms = 0;
};

Pool& pool() {
  static Pool* p = new Pool();  // leaked: no static destructor may touch the runtime
  return *p;
}

// Apply `f` to the aggregate stat and to the stat of the pool a block of `size` belongs to.
template <typename F>
void update(StatArray& stats, size_t size, F f) {
  f(stats[static_cast<size_t>(StatType::AGGREGATE)]);
  const StatType pool_type = size < kLargeThreshold ? StatType::SMALL_POOL : StatType::LARGE_POOL;
  f(stats[static_cast<size_t>(pool_type)]);
}

void count_handed_out(Pool& p, size_t size) {
  update(p.allocated_bytes, size, [size](Stat& s) { s.increase(size); });
  update(p.allocations, size, [](Stat& s) { s.increase(1); });
}

void count_returned(Pool& p, size_t size) {
  update(p.allocated_bytes, size, [size](Stat& s) { s.decrease(size); });
  update(p.allocations, size, [](Stat& s) { s.decrease(1); });
}

void count_reserved(Pool& p, size_t size) {
  update(p.reserved_bytes, size, [size](Stat& s) { s.increase(size); });
  update(p.segments, size, [](Stat& s) { s.increase(1); });
}

void count_released(Pool& p, size_t size) {
  update(p.reserved_bytes, size, [size](Stat& s) { s.decrease(size); });
  update(p.segments, size, [](Stat& s) { s.decrease(1); });
}

const Stat& aggregate(const StatArray& stats) {
  return stats[static_cast<size_t>(StatType::AGGREGATE)];
}

void delete_block(void* ctx) {
  auto* block = static_cast<Block*>(ctx);
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  count_returned(p, block->size);
  p.free_blocks[block->size].push_back(block);
}

}  // namespace

c10::DataPtr CachingAllocator::allocate(size_t nbytes) {
  const c10::Device device(c10::DeviceType::PrivateUse1, 0);
  if (nbytes == 0) {
    return c10::DataPtr(nullptr, nullptr, &delete_block, device);
  }
  const size_t size = round_size(nbytes);
  Pool& p = pool();
  Block* block = nullptr;
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    auto it = p.free_blocks.find(size);
    if (it != p.free_blocks.end() && !it->second.empty()) {
      block = it->second.back();
      it->second.pop_back();
      count_handed_out(p, size);
    }
  }
  if (block == nullptr) {
    auto fresh = std::make_unique<Block>();
    fresh->size = size;
    try {
      ucp::allocate(size, &fresh->mem);
    } catch (const std::exception&) {
      // Out of device memory: give the cache back and try once more before failing.
      {
        std::lock_guard<std::mutex> lock(p.mutex);
        p.alloc_retries += 1;
      }
      empty_cache();
      try {
        ucp::allocate(size, &fresh->mem);
      } catch (const std::exception& e) {
        {
          std::lock_guard<std::mutex> lock(p.mutex);
          p.ooms += 1;
        }
        // torch.OutOfMemoryError in Python, like CUDA, so `except torch.OutOfMemoryError`
        // recovery code works unchanged.
        TORCH_CHECK_WITH(OutOfMemoryError, false, "flagos: out of memory: tried to allocate ",
                         nbytes, " bytes (cached blocks were already released): ", e.what());
      }
    }
    block = fresh.release();
    std::lock_guard<std::mutex> lock(p.mutex);
    count_handed_out(p, size);
    count_reserved(p, size);
    p.alloc_count += 1;
  }
  return c10::DataPtr(block->mem.virAddr, block, &delete_block, device);
}

c10::DeleterFnPtr CachingAllocator::raw_deleter() const {
  return nullptr;  // blocks need their context; no raw-pointer frees
}

void CachingAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  std::memcpy(dest, src, count);
}

void CachingAllocator::empty_cache() {
  std::vector<Block*> victims;
  Pool& p = pool();
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    for (auto& entry : p.free_blocks) {
      victims.insert(victims.end(), entry.second.begin(), entry.second.end());
      entry.second.clear();
    }
    p.free_blocks.clear();
  }
  for (Block* block : victims) {
    ucp::release(&block->mem);
    std::lock_guard<std::mutex> lock(p.mutex);
    count_released(p, block->size);
    p.free_count += 1;
    delete block;
  }
}

MemoryStats CachingAllocator::stats() const {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  MemoryStats out;
  out.allocated = aggregate(p.allocated_bytes).current;
  out.max_allocated = aggregate(p.allocated_bytes).peak;
  out.reserved = aggregate(p.reserved_bytes).current;
  out.max_reserved = aggregate(p.reserved_bytes).peak;
  out.alloc_count = p.alloc_count;
  out.free_count = p.free_count;
  out.num_alloc_retries = p.alloc_retries;
  out.num_ooms = p.ooms;
  return out;
}

void CachingAllocator::reset_peak_stats() {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  for (StatArray* stats : {&p.allocated_bytes, &p.reserved_bytes, &p.allocations, &p.segments}) {
    for (Stat& s : *stats) {
      s.reset_peak();
    }
  }
}

void CachingAllocator::note_adopted(int64_t nbytes) {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  // Adopted CPU results are device memory for as long as they live: count them as both in use
  // and held, and drop them from both when they go (nbytes < 0).
  const auto size = static_cast<size_t>(nbytes < 0 ? -nbytes : nbytes);
  if (nbytes >= 0) {
    count_handed_out(p, size);
    count_reserved(p, size);
  } else {
    count_returned(p, size);
    count_released(p, size);
  }
}

void CachingAllocator::emptyCache(c10::MempoolId_t /*mempool_id*/) { empty_cache(); }

c10::CachingDeviceAllocator::DeviceStats CachingAllocator::getDeviceStats(
    c10::DeviceIndex /*device*/) {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  c10::CachingDeviceAllocator::DeviceStats out;
  out.allocation = p.allocations;
  out.segment = p.segments;
  out.active = p.allocations;  // no stream-ordered reuse: active means allocated
  out.allocated_bytes = p.allocated_bytes;
  out.reserved_bytes = p.reserved_bytes;
  out.active_bytes = p.allocated_bytes;
  out.requested_bytes = p.allocated_bytes;  // sizes are rounded; requests are not tracked apart
  out.num_alloc_retries = p.alloc_retries;
  out.num_ooms = p.ooms;
  out.num_device_alloc = p.alloc_count;
  out.num_device_free = p.free_count;
  return out;
}

void CachingAllocator::resetAccumulatedStats(c10::DeviceIndex /*device*/) {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  for (StatArray* stats : {&p.allocated_bytes, &p.reserved_bytes, &p.allocations, &p.segments}) {
    for (Stat& s : *stats) {
      s.reset_accumulated();
    }
  }
  p.alloc_count = 0;
  p.free_count = 0;
  p.alloc_retries = 0;
  p.ooms = 0;
}

void CachingAllocator::resetPeakStats(c10::DeviceIndex /*device*/) { reset_peak_stats(); }

std::pair<size_t, size_t> CachingAllocator::getMemoryInfo(c10::DeviceIndex /*device*/) {
  // Host memory and the board's UCP memory both come out of the machine's RAM, and the UCP
  // entry points this runtime loads have no heap query: report the RAM's available and total
  // bytes (MemAvailable / MemTotal), which bound what an allocation can get.
  size_t total = 0;
  size_t available = 0;
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char key[64];
    unsigned long long kib = 0;
    while (std::fscanf(f, "%63s %llu kB", key, &kib) == 2) {
      if (std::strcmp(key, "MemTotal:") == 0) {
        total = static_cast<size_t>(kib) * 1024;
      } else if (std::strcmp(key, "MemAvailable:") == 0) {
        available = static_cast<size_t>(kib) * 1024;
      }
    }
    std::fclose(f);
  }
  if (total == 0) {
    const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    total = static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * page;
    available = static_cast<size_t>(sysconf(_SC_AVPHYS_PAGES)) * page;
  }
  return {available, total};
}

Block* CachingAllocator::block_of(const c10::DataPtr& ptr) {
  if (ptr.get_deleter() != &delete_block) {
    return nullptr;
  }
  return static_cast<Block*>(ptr.get_context());
}

CachingAllocator& allocator() {
  static CachingAllocator* instance = new CachingAllocator();
  return *instance;
}

void flush_for_cpu_read(const c10::DataPtr& ptr) {
  if (ucp::backend() != ucp::Backend::Ucp) {
    return;
  }
  if (Block* block = CachingAllocator::block_of(ptr)) {
    ucp::flush(&block->mem, ucp::kFlushInvalidate);
  }
}

void flush_after_cpu_write(const c10::DataPtr& ptr) {
  if (ucp::backend() != ucp::Backend::Ucp) {
    return;
  }
  if (Block* block = CachingAllocator::block_of(ptr)) {
    ucp::flush(&block->mem, ucp::kFlushClean);
  }
}

}  // namespace torch_fl

namespace torch_fl {

void resize_storage_bytes(c10::StorageImpl* storage, size_t nbytes) {
  TORCH_CHECK(storage->resizable(), "flagos: trying to resize a storage that is not resizable");
  c10::DataPtr fresh = allocator().allocate(nbytes);
  const c10::DataPtr& old = storage->data_ptr();
  const size_t keep = std::min(nbytes, storage->nbytes());
  if (old.get() != nullptr && keep > 0) {
    flush_for_cpu_read(old);
    std::memcpy(fresh.get(), old.get(), keep);
    flush_after_cpu_write(fresh);
  }
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(nbytes);
}

}  // namespace torch_fl

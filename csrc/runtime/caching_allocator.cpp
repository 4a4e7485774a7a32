#include "runtime/caching_allocator.h"

#include <c10/util/Exception.h>

#include <algorithm>
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

struct Pool {
  std::mutex mutex;
  std::unordered_map<size_t, std::vector<Block*>> free_blocks;
  MemoryStats stats;
};

Pool& pool() {
  static Pool* p = new Pool();  // leaked: no static destructor may touch the runtime
  return *p;
}

void bump_peaks(MemoryStats& s) {
  s.max_allocated = std::max(s.max_allocated, s.allocated);
  s.max_reserved = std::max(s.max_reserved, s.reserved);
}

void delete_block(void* ctx) {
  auto* block = static_cast<Block*>(ctx);
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  p.stats.allocated -= static_cast<int64_t>(block->size);
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
      p.stats.allocated += static_cast<int64_t>(size);
      bump_peaks(p.stats);
    }
  }
  if (block == nullptr) {
    auto fresh = std::make_unique<Block>();
    fresh->size = size;
    try {
      ucp::allocate(size, &fresh->mem);
    } catch (const std::exception&) {
      // Out of device memory: give the cache back and try once more before failing.
      empty_cache();
      try {
        ucp::allocate(size, &fresh->mem);
      } catch (const std::exception& e) {
        TORCH_CHECK(false, "flagos: ", e.what());
      }
    }
    block = fresh.release();
    std::lock_guard<std::mutex> lock(p.mutex);
    p.stats.allocated += static_cast<int64_t>(size);
    p.stats.reserved += static_cast<int64_t>(size);
    p.stats.alloc_count += 1;
    bump_peaks(p.stats);
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
    p.stats.reserved -= static_cast<int64_t>(block->size);
    p.stats.free_count += 1;
    delete block;
  }
}

MemoryStats CachingAllocator::stats() const {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  return p.stats;
}

void CachingAllocator::reset_peak_stats() {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  p.stats.max_allocated = p.stats.allocated;
  p.stats.max_reserved = p.stats.reserved;
}

void CachingAllocator::note_adopted(int64_t nbytes) {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  // Adopted CPU results are device memory for as long as they live: count them as both in use
  // and held, and drop them from both when they go (nbytes < 0).
  p.stats.allocated += nbytes;
  p.stats.reserved += nbytes;
  bump_peaks(p.stats);
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

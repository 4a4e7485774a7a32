#include "runtime/ucp_runtime.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>

namespace torch_fl::ucp {
namespace {

using MallocCachedFn = int32_t (*)(SysMem*, uint64_t, int32_t);
using FreeFn = int32_t (*)(SysMem*);
using FlushFn = int32_t (*)(SysMem*, int32_t);

struct State {
  std::once_flag once;
  std::mutex config_mutex;
  std::string explicit_path;
  Backend backend = Backend::Host;
  std::string path;
  std::string warning;
  MallocCachedFn malloc_cached = nullptr;
  FreeFn free_fn = nullptr;
  FlushFn flush_fn = nullptr;
};

// Leaked on purpose: nothing here may be torn down by a static destructor, because at exit the
// vendor library may already have destroyed its own heap (see docs/architecture.md, exit order).
State& state() {
  static State* s = new State();
  return *s;
}

// Try one candidate; on success fill the state and return true. `why` collects failures so the
// warning can say exactly what was wrong with an explicit path.
bool try_load(State& s, const std::string& candidate, std::string* why) {
  // RTLD_NODELETE: never unmapped, so late frees can't jump into an unloaded library.
  void* handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* err = dlerror();
    *why = std::string("cannot load ") + candidate + ": " + (err ? err : "unknown dlopen error");
    return false;
  }
  auto m = reinterpret_cast<MallocCachedFn>(dlsym(handle, "hbUCPMallocCached"));
  auto f = reinterpret_cast<FreeFn>(dlsym(handle, "hbUCPFree"));
  auto fl = reinterpret_cast<FlushFn>(dlsym(handle, "hbUCPMemFlush"));
  if (m == nullptr || f == nullptr || fl == nullptr) {
    *why = candidate +
        " is not a UCP runtime: missing hbUCPMallocCached, hbUCPFree or hbUCPMemFlush";
    return false;
  }
  s.malloc_cached = m;
  s.free_fn = f;
  s.flush_fn = fl;
  s.backend = Backend::Ucp;
  s.path = candidate;
  return true;
}

void load(State& s) {
  std::string explicit_path;
  {
    std::lock_guard<std::mutex> lock(s.config_mutex);
    explicit_path = s.explicit_path;
  }
  std::string why;
  if (!explicit_path.empty()) {
    if (try_load(s, explicit_path, &why)) {
      return;
    }
    // An explicit but broken path is a configuration mistake: say so, and keep working on host
    // memory rather than crash an import on a developer machine.
    s.warning = "FLAGOS_BPU_UCP_LIB: " + why +
        "; using host memory. Fix the path (or unset FLAGOS_BPU_UCP_LIB) to use the board's "
        "UCP allocator.";
    return;
  }
  for (const char* candidate : {"/usr/hobot/lib/libhbucp.so", "libhbucp.so"}) {
    if (try_load(s, candidate, &why)) {
      return;
    }
  }
  // No runtime found: the normal case on an x86_64 host, so no warning.
}

}  // namespace

void configure(const std::string& explicit_path) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.config_mutex);
  s.explicit_path = explicit_path;
}

Backend backend() {
  State& s = state();
  std::call_once(s.once, [&s] { load(s); });
  return s.backend;
}

const char* backend_name() {
  return backend() == Backend::Ucp ? "ucp" : "host";
}

std::string loaded_path() {
  backend();
  return state().path;
}

std::string load_warning() {
  backend();
  return state().warning;
}

size_t page_size() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

void allocate(size_t size, SysMem* out) {
  State& s = state();
  if (backend() == Backend::Ucp) {
    int32_t rc = s.malloc_cached(out, size, 0);
    if (rc != 0 || out->virAddr == nullptr) {
      throw std::runtime_error(
          "hbUCPMallocCached(" + std::to_string(size) + " bytes) failed with code " +
          std::to_string(rc) + "; free cached blocks with torch.flagos.empty_cache() or reduce "
          "the working set");
    }
    return;
  }
  const size_t page = page_size();
  const size_t rounded = ((size + page - 1) / page) * page;
  void* ptr = std::aligned_alloc(page, rounded == 0 ? page : rounded);
  if (ptr == nullptr) {
    throw std::runtime_error(
        "out of host memory allocating " + std::to_string(size) + " bytes for a flagos tensor");
  }
  out->phyAddr = 0;
  out->virAddr = ptr;
  out->memSize = rounded;
}

void release(SysMem* mem) {
  if (mem->virAddr == nullptr) {
    return;
  }
  if (backend() == Backend::Ucp) {
    state().free_fn(mem);
  } else {
    std::free(mem->virAddr);
  }
  mem->virAddr = nullptr;
}

void flush(SysMem* mem, int flag) {
  if (backend() == Backend::Ucp && mem->virAddr != nullptr) {
    state().flush_fn(mem, flag);
  }
}

}  // namespace torch_fl::ucp

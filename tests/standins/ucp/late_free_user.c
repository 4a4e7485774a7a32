/*
 * Negative control for the stand-in libhbucp (tests only): a library that loads the UCP runtime
 * at run time and frees a block from its own static destructor, i.e. exactly what a naive
 * caching allocator does. Loaded at run time, the UCP library is finalised first, so this free
 * arrives after teardown and must abort.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
  uint64_t phyAddr;
  void *virAddr;
  uint64_t memSize;
} hbUCPSysMem;

static hbUCPSysMem g_block;
static int32_t (*g_free)(hbUCPSysMem *);

int late_free_setup(const char *ucp_path) {
  void *h = dlopen(ucp_path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) return 1;
  int32_t (*alloc)(hbUCPSysMem *, uint64_t, int32_t) = dlsym(h, "hbUCPMallocCached");
  g_free = dlsym(h, "hbUCPFree");
  if (alloc == NULL || g_free == NULL) return 2;
  return alloc(&g_block, 4096, 0) == 0 ? 0 : 3;
}

__attribute__((destructor)) static void late_free(void) {
  if (g_free != NULL && g_block.virAddr != NULL) g_free(&g_block);
}

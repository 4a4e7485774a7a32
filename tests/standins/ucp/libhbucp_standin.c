/*
 * STAND-IN for the board's libhbucp.so, for tests only. Never shipped, never loaded by product
 * code unless a test points FLAGOS_BPU_UCP_LIB at it.
 *
 * It implements the three entry points torch_fl uses (hbUCPMallocCached, hbUCPFree,
 * hbUCPMemFlush) over page-aligned host memory and mimics the one behaviour that matters for
 * exit cleanliness: the real library tears its heap down in its own library destructor, and a
 * hbUCPFree that arrives after that aborts with "double free or corruption". This stand-in does
 * the same, so a caching allocator that frees from a static destructor is caught here exactly as
 * it would be on a board.
 *
 * STANDIN_UCP_STATS=<path>: at teardown, write "allocs=N frees=M flushes=F live=L" there, so
 * tests can prove the allocations really went through this library.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
  uint64_t phyAddr;
  void *virAddr;
  uint64_t memSize;
} hbUCPSysMem;

#define MAX_BLOCKS 65536

struct heap {
  void *blocks[MAX_BLOCKS];
  long allocs, frees, flushes, live;
};

static struct heap *g_heap; /* NULL before init and after teardown */
static int g_torn_down;

static void standin_teardown(void);

/* The real library's heap is a C++ singleton whose destructor is registered with the C runtime's
 * exit handlers when it is created, i.e. after torch_fl._C has loaded. Exit handlers run in
 * reverse order of registration, so the heap dies before any static destructor of an object that
 * existed earlier (torch_fl._C's, or late_free_user.c's below). Registering the teardown with
 * atexit() from the constructor reproduces that order on every glibc, whatever order the dynamic
 * loader later finalises the libraries in. */
__attribute__((constructor)) static void standin_init(void) {
  g_heap = calloc(1, sizeof(struct heap));
  atexit(standin_teardown);
}

static void standin_teardown(void) {
  const char *path = getenv("STANDIN_UCP_STATS");
  if (path != NULL && g_heap != NULL) {
    FILE *f = fopen(path, "w");
    if (f != NULL) {
      fprintf(f, "allocs=%ld frees=%ld flushes=%ld live=%ld\n", g_heap->allocs, g_heap->frees,
              g_heap->flushes, g_heap->live);
      fclose(f);
    }
  }
  free(g_heap);
  g_heap = NULL;
  g_torn_down = 1;
}

static void die_like_glibc(void) {
  static const char msg[] = "double free or corruption (stand-in libhbucp: freed after teardown)\n";
  ssize_t ignored = write(2, msg, sizeof(msg) - 1);
  (void)ignored;
  abort();
}

static long slot_of(void *ptr) {
  for (long i = 0; i < MAX_BLOCKS; ++i) {
    if (g_heap->blocks[i] == ptr) return i;
  }
  return -1;
}

int32_t hbUCPMallocCached(hbUCPSysMem *mem, uint64_t size, int32_t device_id) {
  (void)device_id;
  if (g_heap == NULL || mem == NULL) return -1;
  long slot = slot_of(NULL);
  if (slot < 0) return -2;
  long page = sysconf(_SC_PAGESIZE);
  uint64_t rounded = ((size + page - 1) / page) * page;
  void *ptr = aligned_alloc(page, rounded ? rounded : page);
  if (ptr == NULL) return -3;
  g_heap->blocks[slot] = ptr;
  g_heap->allocs++;
  g_heap->live++;
  mem->phyAddr = (uint64_t)(uintptr_t)ptr; /* identity "physical" address */
  mem->virAddr = ptr;
  mem->memSize = rounded;
  return 0;
}

int32_t hbUCPFree(hbUCPSysMem *mem) {
  if (g_torn_down || g_heap == NULL) die_like_glibc();
  long slot = slot_of(mem->virAddr);
  if (slot < 0) die_like_glibc();
  free(mem->virAddr);
  g_heap->blocks[slot] = NULL;
  g_heap->frees++;
  g_heap->live--;
  return 0;
}

int32_t hbUCPMemFlush(hbUCPSysMem *mem, int32_t flag) {
  if (g_heap == NULL) return -1;
  if (flag != 1 && flag != 2) return -4;
  if (slot_of(mem->virAddr) < 0) return -5;
  g_heap->flushes++;
  return 0;
}

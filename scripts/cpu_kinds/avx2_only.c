/* A stand-in for benchmarks only, never loaded by the product: makes this x86_64 host's CPUID
 * describe an AVX2-only CPU (no AVX-512, no VNNI of any width, no AMX), so that ONNX Runtime's
 * MLAS, PyTorch, oneDNN and this project's extension, which all read CPUID to pick their
 * kernels, run the code an AVX2-only host runs (scripts/cpu_kind.py builds and preloads it;
 * `bench_sim.py --cpu-kind avx2`).
 *
 * How: Linux's CPUID faulting (arch_prctl ARCH_SET_CPUID, 0; the CPU flag `cpuid_fault`) turns
 * every CPUID this process executes into a SIGSEGV. The handler executes the real CPUID with
 * faulting briefly off, clears the feature bits below and steps over the instruction. Threads
 * inherit the faulting; an exec drops it. The kernel's own /proc/cpuinfo still lists the real
 * flags (the caller passes what the emulated CPU has), and code that checked CPUID before this
 * library loaded (the dynamic loader's choice of glibc's string functions) keeps its choice.
 */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <cpuid.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#define BIT(n) (1u << (n))

static struct sigaction previous;

static long set_cpuid(int enabled) { return syscall(SYS_arch_prctl, ARCH_SET_CPUID, enabled); }

/* The feature bits an AVX2-only CPU (Haswell to Zen 3) lacks, cleared from leaf/subleaf. */
static void mask(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
  if (leaf == 7 && sub == 0) {
    /* EBX: AVX512F, DQ, IFMA, PF, ER, CD, BW, VL */
    r[1] &= ~(BIT(16) | BIT(17) | BIT(21) | BIT(26) | BIT(27) | BIT(28) | BIT(30) | BIT(31));
    /* ECX: AVX512_VBMI, VBMI2, VNNI, BITALG, VPOPCNTDQ */
    r[2] &= ~(BIT(1) | BIT(6) | BIT(11) | BIT(12) | BIT(14));
    /* EDX: AVX512_4VNNIW, 4FMAPS, VP2INTERSECT, AMX_BF16, AVX512_FP16, AMX_TILE, AMX_INT8 */
    r[3] &= ~(BIT(2) | BIT(3) | BIT(8) | BIT(22) | BIT(23) | BIT(24) | BIT(25));
  } else if (leaf == 7 && sub == 1) {
    /* EAX: AVX_VNNI, AVX512_BF16, AMX_FP16, AVX_IFMA; EDX: AVX_VNNI_INT8, AVX_NE_CONVERT,
       AMX_COMPLEX, AVX_VNNI_INT16, AVX10 */
    r[0] &= ~(BIT(4) | BIT(5) | BIT(21) | BIT(23));
    r[3] &= ~(BIT(4) | BIT(5) | BIT(8) | BIT(10) | BIT(19));
  } else if (leaf == 0xD && sub == 0) {
    /* the XSAVE state components: AVX-512's opmask and upper registers, AMX's tiles */
    r[0] &= ~(BIT(5) | BIT(6) | BIT(7) | BIT(17) | BIT(18));
  } else if (leaf == 0x1D || leaf == 0x1E || leaf == 0x24) {
    r[0] = r[1] = r[2] = r[3] = 0; /* AMX tile and AVX10 leaves */
  }
}

static void on_fault(int sig, siginfo_t* info, void* context) {
  ucontext_t* uc = (ucontext_t*)context;
  greg_t* regs = uc->uc_mcontext.gregs;
  const uint8_t* ip = (const uint8_t*)regs[REG_RIP];
  if (ip[0] == 0x0f && ip[1] == 0xa2) { /* CPUID */
    uint32_t r[4];
    const uint32_t leaf = (uint32_t)regs[REG_RAX], sub = (uint32_t)regs[REG_RCX];
    set_cpuid(1);
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
    set_cpuid(0);
    mask(leaf, sub, r);
    regs[REG_RAX] = r[0], regs[REG_RBX] = r[1], regs[REG_RCX] = r[2], regs[REG_RDX] = r[3];
    regs[REG_RIP] += 2;
    return;
  }
  /* a real fault: whoever handled SIGSEGV before us, or the default (a core dump) */
  if (previous.sa_flags & SA_SIGINFO) {
    previous.sa_sigaction(sig, info, context);
    return;
  }
  sigaction(SIGSEGV, &previous, NULL);
  if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    previous.sa_handler(sig);
  }
}

__attribute__((constructor)) static void start(void) {
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_sigaction = on_fault;
  action.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  sigaction(SIGSEGV, &action, &previous);
  if (set_cpuid(0) != 0) {
    fprintf(stderr, "avx2_only stand-in: this CPU or kernel has no CPUID faulting "
                    "(arch_prctl ARCH_SET_CPUID): cannot emulate an AVX2-only host here\n");
    _exit(3);
  }
}

"""The page-size probe: a tiny x86_64 program run under box64.

A version string proves nothing (an old box64 prints it and then aborts on large pages) and an
exit code proves little (some setups exit 0 without running the program), so the probe prints a
marker plus the page size from its auxiliary vector, and both are checked. It uses no libc: a
`gcc -static` glibc program fails under every box64, while a no-libc static-PIE one works.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from provision.box64 import PAGESIZE_ABORT
from provision.floor import exitcodes, light

MARKER = "TORCH_FL_PROBE_OK"
BINARY_NAME = "torch-fl-pagesize-probe-x86_64"

SOURCE = r"""
/* torch-fl page-size probe: x86_64, no libc, static PIE. Prints MARKER pagesize=N where N is
   AT_PAGESZ from the auxiliary vector, i.e. the page size the (emulated) guest was given. */
typedef unsigned long u64;
static long sys3(long n, long a, long b, long c) {
  long r;
  __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
  return r;
}
static void put(const char *s) { u64 n = 0; while (s[n]) n++; sys3(1, 1, (long)s, (long)n); }
__attribute__((used)) void probe_main(u64 *sp) {
  u64 argc = sp[0];
  u64 *p = sp + 1 + argc + 1;          /* skip argv and its NULL */
  while (*p) p++;                      /* skip envp */
  p++;
  u64 page = 0;
  for (; p[0]; p += 2) if (p[0] == 6) page = p[1];   /* AT_PAGESZ */
  char buf[32]; int i = 31; buf[i] = 0;
  do { buf[--i] = (char)('0' + page % 10); page /= 10; } while (page && i > 0);
  put("@MARKER@ pagesize="); put(buf + i); put("\n");
  sys3(231, 0, 0, 0);                  /* exit_group(0) */
}
__asm__(".text\n.global _start\n_start:\n mov %rsp, %rdi\n and $-16, %rsp\n call probe_main\n hlt\n");
""".replace("@MARKER@", MARKER)

CFLAGS = [
    "-O2",
    "-nostdlib",
    "-static-pie",
    "-fPIE",
    "-ffreestanding",
    "-fno-stack-protector",
    "-fno-asynchronous-unwind-tables",
]


class ProbeBuildError(RuntimeError):
    pass


def find_x86_compiler(controller_arch: str) -> str | None:
    """A compiler on the controller that emits x86_64 code."""
    names = ["x86_64-linux-gnu-gcc"]
    if controller_arch == "x86_64":
        names = ["cc", "gcc", "clang", *names]
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


def build(out_dir: Path, controller_arch: str, artifacts: Path | None = None) -> Path:
    """Return a probe binary: from --artifacts if shipped there, else compiled here."""
    if artifacts is not None and (artifacts / BINARY_NAME).is_file():
        return artifacts / BINARY_NAME
    out = out_dir / BINARY_NAME
    if out.is_file():
        return out
    compiler = find_x86_compiler(controller_arch)
    if compiler is None:
        raise ProbeBuildError(
            "no x86_64 compiler on this machine to build the page-size probe; install "
            f"gcc-x86-64-linux-gnu, or put a prebuilt {BINARY_NAME} into --artifacts"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    src = out_dir / "probe.c"
    src.write_text(SOURCE, encoding="utf-8")
    with light.load("atomic").replacing(out) as tmp:
        proc = subprocess.run(
            [compiler, *CFLAGS, "-o", str(tmp), str(src)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise ProbeBuildError(
                f"compiling the probe with {compiler} failed: {proc.stderr[-800:]}"
            )
    return out


@dataclass(frozen=True)
class ProbeVerdict:
    ok: bool
    guest_pagesize: int | None
    detail: str


def interpret(rc: int, out: str, err: str, kernel_pagesize: int, box64: str) -> ProbeVerdict:
    """Judge a probe run; a failure names the cause and the fix."""
    text = f"{out}\n{err}"
    if PAGESIZE_ABORT in text:
        return ProbeVerdict(
            False,
            None,
            f"{box64} aborts on this {kernel_pagesize}-byte-page kernel ({PAGESIZE_ABORT}): it "
            "was built for a fixed 4 KB page size (box64 <= 0.2.6). Fix: install box64 >= 0.4.0 "
            "(re-run `invoke provision --only box64,pagesize_probe`) and remove the old one "
            "from PATH",
        )
    match = re.search(rf"{MARKER} pagesize=(\d+)", out)
    if rc == exitcodes.TIMED_OUT:
        return ProbeVerdict(False, None, f"{box64} did not finish the probe in time (hung)")
    if rc != 0:
        tail = text.strip()[-300:]
        return ProbeVerdict(
            False, None, f"{box64} failed to run the x86_64 probe (rc {rc}): {tail}"
        )
    if not match:
        return ProbeVerdict(
            False,
            None,
            f"{box64} exited 0 but the probe never ran (no {MARKER} marker in its output); "
            "it is not a working x86_64 emulator: check that it is the real box64 and "
            "that BOX64_* environment settings do not disable execution",
        )
    guest = int(match[1])
    if guest != kernel_pagesize:
        return ProbeVerdict(
            False,
            guest,
            f"the x86_64 guest sees page size {guest} but the kernel uses {kernel_pagesize}; "
            "this box64 fakes a fixed page size and will corrupt memory mappings. Fix: box64 "
            ">= 0.4.0",
        )
    return ProbeVerdict(True, guest, f"x86_64 probe ran under {box64}; guest page size {guest}")

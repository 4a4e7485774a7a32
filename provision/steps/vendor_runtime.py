"""The board's vendor runtime (libhbucp, hbm_runtime, BPU cores): checked, never installed -
it comes with the board image."""

from __future__ import annotations

import shlex

from provision.context import Context
from provision.results import (
    FAILED,
    OK,
    CheckResult,
    Inputs,
    StepError,
    VendorRuntimeFound,
    not_applicable,
)

_SNIPPET = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
cores = -1
if hasattr(lib, "hb_bpu_core_num"):
    lib.hb_bpu_core_num.restype = ctypes.c_int
    cores = lib.hb_bpu_core_num()
try:
    import hbm_runtime  # noqa: F401
    hbm = "yes"
except Exception as exc:  # report why, the step turns it into a failure
    hbm = "no: %s" % exc
print("TFL_UCP loaded cores=%d hbm_runtime=%s" % (cores, hbm))
"""


class VendorRuntime:
    name = "vendor_runtime"
    title = "vendor BPU runtime"
    requires: tuple[str, ...] = ()

    def check(self, ctx: Context, inputs: Inputs) -> CheckResult:
        if not ctx.facts.get("is_board"):
            return not_applicable("not an RDK board (no /usr/hobot/lib/libhbucp.so)")
        lib = ctx.facts.get("ucp_lib") or "/usr/hobot/lib/libhbucp.so"
        rc, out, err = ctx.sh(f"python3 -c {shlex.quote(_SNIPPET)} {shlex.quote(lib)}", timeout=60)
        line = next((ln for ln in out.splitlines() if ln.startswith("TFL_UCP")), "")
        facts = {"ucp_lib": lib, "raw": line or (out + err).strip()[-300:]}
        if not line:
            return CheckResult(FAILED, facts, f"{lib} does not load: {facts['raw']}")
        cores = int(line.split("cores=")[1].split()[0])
        facts["bpu_cores"] = cores
        found = VendorRuntimeFound(lib)
        if "hbm_runtime=yes" not in line:
            return CheckResult(FAILED, facts, "hbm_runtime is not importable with python3", found)
        if cores == 0:
            return CheckResult(
                FAILED, facts, "libhbucp reports 0 BPU cores: the BPU driver is not loaded", found
            )
        shown = "unknown" if cores < 0 else str(cores)
        detail = f"libhbucp loads, hbm_runtime importable, BPU cores: {shown}"
        return CheckResult(OK, facts, detail, found)

    def apply(self, ctx: Context, before: CheckResult, inputs: Inputs) -> None:
        raise StepError(
            f"{before.detail}; the vendor runtime comes with the board image: reflash or "
            "reinstall the vendor packages (hobot-*), then re-run"
        )


STEP = VendorRuntime()

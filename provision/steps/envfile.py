"""The per-user env file torch_fl reads by itself (see torch_fl/envfile.py for the reader)."""

from __future__ import annotations

import shlex

from provision import facts as facts_mod
from provision.steps import NEEDED, OK, CheckResult, Context
from provision.steps.box64 import STEP as BOX64
from provision.steps.vendor_runtime import STEP as VENDOR
from provision.steps.x86_python import STEP as X86

HEADER = "# Written by `invoke provision`; real environment variables override these values.\n"


def parse(text: str) -> dict[str, str]:
    values = {}
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def render(values: dict[str, str]) -> str:
    return HEADER + "".join(f"{k}={v}\n" for k, v in sorted(values.items()))


class EnvFile:
    name = "envfile"
    title = "environment file"

    def desired(self, ctx: Context) -> dict[str, str]:
        # Earlier steps fill ctx.state during their checks; refresh when run with --only.
        if ctx.arch == "aarch64" and "box64" not in ctx.state:
            BOX64.check(ctx)
        if "x86_python" not in ctx.state:
            X86.check(ctx)
        if ctx.facts.get("is_board") and "ucp_lib" not in ctx.state:
            VENDOR.check(ctx)
        march = ctx.config["march"]
        if march == "auto":
            march = facts_mod.march_for(ctx.facts) or ctx.config["default_march"]
        values = {
            "FLAGOS_BPU_MARCH": march,
            "FLAGOS_BPU_CACHE": ctx.expand(ctx.config["cache_dir"]),
        }
        if ctx.state.get("x86_python"):
            values["FLAGOS_BPU_X86_PYTHON"] = ctx.state["x86_python"]
        if ctx.arch == "aarch64" and ctx.state.get("box64"):
            values["FLAGOS_BPU_EMULATOR"] = ctx.state["box64"]
            libs = [ctx.state.get("x86_guest_libs"), ctx.state.get("box64_guest_libs")]
            if any(libs):
                values["FLAGOS_BPU_GUEST_LIBS"] = ":".join(p for p in libs if p)
        if ctx.state.get("ucp_lib"):
            values["FLAGOS_BPU_UCP_LIB"] = ctx.state["ucp_lib"]
        return values

    def check(self, ctx: Context) -> CheckResult:
        path = ctx.facts["env_file"]
        want = self.desired(ctx)
        rc, out, _ = ctx.sh(f"cat {shlex.quote(path)} 2>/dev/null")
        have = parse(out) if rc == 0 else {}
        facts = {"path": path, "values": want}
        if rc != 0:
            return CheckResult(NEEDED, facts, f"{path} missing")
        diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
        if diff:
            facts["differs"] = diff
            return CheckResult(NEEDED, facts, f"{path} differs in {', '.join(diff)}")
        return CheckResult(OK, facts, f"{path} up to date ({len(want)} settings)")

    def apply(self, ctx: Context, before: CheckResult) -> None:
        ctx.write_file_atomic(ctx.facts["env_file"], render(before.facts["values"]))


STEP = EnvFile()

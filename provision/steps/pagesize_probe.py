"""Prove box64 works on this kernel: run a real x86_64 program and compare the page size."""

from __future__ import annotations

import shlex

from provision import probe
from provision.context import Context
from provision.results import FAILED, OK, CheckResult, Inputs, StepError, not_applicable
from provision.target import controller_arch


class PageSizeProbe:
    name = "pagesize_probe"
    title = "x86_64 page-size probe under box64"
    requires = ("box64",)

    def check(self, ctx: Context, inputs: Inputs) -> CheckResult:
        if ctx.arch != "aarch64":
            return not_applicable(f"{ctx.arch} runs x86_64 code natively")
        box64 = inputs.box64.path if inputs.box64 else None
        kernel = int(ctx.facts.get("pagesize") or 0)
        if not box64:
            return CheckResult(FAILED, {"kernel_pagesize": kernel}, "no usable box64 (step box64)")
        try:
            local = probe.build(ctx.work_dir / "probe", controller_arch(), ctx.options.artifacts)
        except probe.ProbeBuildError as exc:
            return CheckResult(FAILED, {"kernel_pagesize": kernel}, str(exc))
        rc, tmp, _ = ctx.sh("mktemp -d")
        tmp = tmp.strip()
        remote = f"{tmp}/{probe.BINARY_NAME}"
        try:
            ctx.target.put(local, remote)
            rc, out, err = ctx.sh(
                f"chmod +x {shlex.quote(remote)} && BOX64_NOBANNER=1 BOX64_LOG=0 "
                f"{shlex.quote(box64)} {shlex.quote(remote)}",
                timeout=120,
            )
        finally:
            ctx.sh(f"rm -rf {shlex.quote(tmp)}")
        verdict = probe.interpret(rc, out, err, kernel, box64)
        facts = {
            "box64": box64,
            "kernel_pagesize": kernel,
            "guest_pagesize": verdict.guest_pagesize,
            "rc": rc,
        }
        return CheckResult(OK if verdict.ok else FAILED, facts, verdict.detail)

    def apply(self, ctx: Context, before: CheckResult, inputs: Inputs) -> None:
        raise StepError(f"the probe cannot be fixed by itself: {before.detail}")


STEP = PageSizeProbe()

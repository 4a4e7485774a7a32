"""Build prerequisites for the steps that always run; box64's build tools come lazily with the
source build so a board that gets box64 from the distro never installs a compiler."""

from __future__ import annotations

from provision.context import Context
from provision.results import NEEDED, OK, CheckResult, Inputs, StepError

# name -> (probe command, distro package)
_COMMON = {
    "tar": ("command -v tar", "tar"),
    "sha256sum": ("command -v sha256sum", "coreutils"),
}
_X86 = {
    "cc": ("command -v cc || command -v gcc", "build-essential"),
    "python3-venv": ("python3 -c 'import venv, ensurepip'", "python3-venv"),
}


def requirements(arch: str) -> dict[str, tuple[str, str]]:
    reqs = dict(_COMMON)
    if arch == "x86_64":
        reqs.update(_X86)
    return reqs


def apt_install(ctx: Context, step: str, packages: list[str]) -> None:
    """Install distro packages (apt); update the index once if the first try fails."""
    if not ctx.facts.get("apt"):
        raise StepError(
            f"missing {', '.join(packages)} and no apt-get on {ctx.target.name}; install them "
            "with the distro's package manager and re-run"
        )
    sudo = ctx.sudo()
    pkgs = " ".join(packages)
    env = "DEBIAN_FRONTEND=noninteractive"
    cmd = f"{sudo}env {env} apt-get install -y --no-install-recommends --no-remove {pkgs}"
    rc, log = ctx.run_long(step, cmd, timeout=1800)
    if rc != 0:
        rc, log = ctx.run_long(step, f"{sudo}env {env} apt-get update && {cmd}", timeout=1800)
    if rc != 0:
        raise StepError(f"apt-get install {pkgs} failed (rc {rc}); see {log}")


class Prereqs:
    name = "prereqs"
    title = "build prerequisites"
    requires: tuple[str, ...] = ()

    def check(self, ctx: Context, inputs: Inputs) -> CheckResult:
        missing = []
        for name, (probe, _pkg) in requirements(ctx.arch).items():
            rc, _, _ = ctx.sh(probe, timeout=60)
            if rc != 0:
                missing.append(name)
        facts = {"missing": missing}
        if missing:
            return CheckResult(NEEDED, facts, f"missing: {', '.join(missing)}")
        return CheckResult(OK, facts, "present: " + ", ".join(requirements(ctx.arch)))

    def apply(self, ctx: Context, before: CheckResult, inputs: Inputs) -> None:
        reqs = requirements(ctx.arch)
        packages = sorted({reqs[name][1] for name in before.facts["missing"]})
        apt_install(ctx, self.name, packages)


STEP = Prereqs()

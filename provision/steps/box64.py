"""box64 on aarch64 targets: find it, read its version, keep / install the distro package /
build the pinned release into the project prefix. Never touches an x86_64 machine."""

from __future__ import annotations

import shlex

from provision import artifacts
from provision import box64 as logic
from provision.context import Context
from provision.results import (
    FAILED,
    NEEDED,
    OK,
    Box64Found,
    CheckResult,
    Inputs,
    StepError,
    not_applicable,
)
from provision.steps.prereqs import apt_install

MARKER = ".complete.json"


def prefix_dir(ctx: Context) -> str:
    return f"{ctx.prefix}/box64"


# Where distro packages and `make install` put box64. Looked at even when another box64 comes
# first in PATH: an old build shadowing a freshly installed package must not hide it (the
# environment file then names the good one by absolute path).
WELL_KNOWN = ("/usr/bin/box64", "/usr/local/bin/box64")


def candidates(ctx: Context) -> list[str]:
    explicit = ctx.config.box64.path
    if explicit:
        return [ctx.expand(explicit)]
    found = [f"{prefix_dir(ctx)}/bin/box64"]
    rc, out, _ = ctx.sh("which -a box64 2>/dev/null || command -v box64")
    if rc == 0:
        found.extend(line.strip() for line in out.splitlines() if line.strip())
    found.extend(WELL_KNOWN)
    return list(dict.fromkeys(found))  # keep order, drop duplicates


def probe_version(ctx: Context, path: str) -> tuple[logic.Version | None, str]:
    rc, out, err = ctx.sh(f"BOX64_NOBANNER=1 {shlex.quote(path)} -v", timeout=30)
    return logic.parse_version(out, err), (out + err).strip()[:200]


def project_install_ok(ctx: Context) -> tuple[bool, str]:
    """A project-prefix box64 counts only with its completion marker and a matching binary."""
    marker = ctx.read_marker(f"{prefix_dir(ctx)}/{MARKER}")
    binary = f"{prefix_dir(ctx)}/bin/box64"
    rc, out, _ = ctx.sh(f"test -e {shlex.quote(prefix_dir(ctx))} && echo exists")
    if marker is None:
        return False, "partial" if out.strip() == "exists" else "absent"
    rc, out, _ = ctx.sh(f"sha256sum {shlex.quote(binary)}")
    if rc != 0 or out.split()[:1] != [marker.get("sha256")]:
        return False, "partial"
    return True, "complete"


def _version(entry: dict) -> logic.Version | None:
    return logic.parse_policy(entry["version"]) if entry["version"] != "none" else None


class Box64Step:
    name = "box64"
    title = "box64 x86_64 emulator"
    requires: tuple[str, ...] = ()

    def check(self, ctx: Context, inputs: Inputs) -> CheckResult:
        if not logic.may_install_on(ctx.arch):
            return not_applicable(f"{ctx.arch} runs x86_64 code natively")
        minimum = logic.parse_policy(ctx.config.policy.min_box64)
        project_ok, project_state = project_install_ok(ctx)
        facts: dict = {"min": logic.fmt(minimum), "project_install": project_state}
        seen = []
        for path in candidates(ctx):
            if path.startswith(prefix_dir(ctx)) and not project_ok:
                continue
            rc, _, _ = ctx.sh(f"test -x {shlex.quote(path)}")
            if rc != 0:
                continue
            version, raw = probe_version(ctx, path)
            seen.append({"path": path, "version": logic.fmt(version), "raw": raw})
        facts["seen"] = seen
        good = next(
            (e for e in seen if logic.meets_policy(_version(e), minimum)),
            None,
        )
        # The box64 a shell would run. If it is below policy it is replaced (moved aside) even
        # when a good one exists elsewhere: anyone typing `box64` would still get the old one.
        rc, out, _ = ctx.sh("command -v box64")
        first = out.strip() if rc == 0 else ""
        shadow = next(
            (
                e
                for e in seen
                if e["path"] == first and not logic.meets_policy(_version(e), minimum)
            ),
            None,
        )
        found = None
        if good is not None:
            in_prefix = good["path"].startswith(prefix_dir(ctx))
            found = Box64Found(
                good["path"],
                good["version"],
                f"{prefix_dir(ctx)}/lib/x86_64-linux-gnu" if in_prefix else "",
            )
            facts.update(path=good["path"], version=good["version"])
            if shadow is None:
                return CheckResult(OK, facts, f"box64 {good['version']} at {good['path']}", found)
        if shadow is not None:
            facts["shadow"] = shadow["path"]
            return CheckResult(
                NEEDED,
                facts,
                f"box64 {shadow['version']} at {shadow['path']} (first in PATH) is older than "
                f"{logic.fmt(minimum)}: will replace it",
                found,
            )
        if project_state == "partial":
            return CheckResult(NEEDED, facts, "partial install in project prefix: will redo")
        if ctx.config.box64.path and not seen:
            return CheckResult(
                FAILED, facts, f"box64.path {candidates(ctx)[0]} is not an executable; fix it"
            )
        if seen:
            best = seen[0]
            return CheckResult(
                NEEDED,
                facts,
                f"box64 {best['version']} at {best['path']} is older than {logic.fmt(minimum)}",
            )
        return CheckResult(NEEDED, facts, "box64 not found")

    def decide(self, ctx: Context, before: CheckResult) -> logic.InstallDecision:
        minimum = logic.parse_policy(ctx.config.policy.min_box64)
        candidate = None
        libc_needed = None
        if ctx.facts.get("apt") and ctx.config.box64.allow_distro:
            # Stale package lists would show an old candidate (or none) and send us to a
            # source build for nothing: refresh them first. Only reached from apply().
            ctx.sh(
                f"{ctx.sudo()}env DEBIAN_FRONTEND=noninteractive apt-get update -qq", timeout=600
            )
            rc, out, _ = ctx.sh("apt-cache policy box64", timeout=60)
            if rc == 0:
                _, candidate = logic.parse_apt_policy(out)
            if candidate:
                rc, out, _ = ctx.sh(f"apt-cache show box64={shlex.quote(candidate)}", timeout=60)
                libc_needed = logic.parse_libc_requirement(out) if rc == 0 else None
        found = None
        seen = before.facts.get("seen") or []
        if seen:
            found = logic.parse_policy(seen[0]["version"]) if seen[0]["version"] != "none" else None
        return logic.decide_install(
            found,
            minimum,
            candidate=candidate,
            libc_needed=libc_needed,
            glibc=logic.parse_glibc(str(ctx.facts.get("glibc", ""))),
            allow_distro=ctx.config.box64.allow_distro,
        )

    def apply(self, ctx: Context, before: CheckResult, inputs: Inputs) -> None:
        if not logic.may_install_on(ctx.arch):
            raise StepError(f"refusing to install box64 on {ctx.arch}")
        shadow = before.facts.get("shadow")
        if shadow:
            self.move_aside(ctx, shadow)
        if before.facts.get("path"):
            return  # a good box64 was already there; only the shadowing one had to go
        decision = self.decide(ctx, before)
        ctx.echo(f"  [box64] {decision.reason}")
        if decision.kind == "distro":
            apt_install(ctx, self.name, ["box64"])
            return
        self.build_from_source(ctx)

    def move_aside(self, ctx: Context, path: str) -> None:
        """Take an old box64 out of PATH, keeping it (nothing is deleted).

        A packaged one is upgraded by the package manager instead; only a hand-installed
        binary is renamed to `<path>.torch-fl-old`.
        """
        rc, _, _ = ctx.sh(f"dpkg -S {shlex.quote(path)} >/dev/null 2>&1")
        if rc == 0:
            return  # owned by a package: the distro install/upgrade replaces it
        q = shlex.quote(path)
        rc, _, err = ctx.sh(f"{ctx.sudo()}mv -f {q} {q}.torch-fl-old")
        if rc != 0:
            raise StepError(f"cannot move the old box64 {path} aside: {err.strip()}; remove it")
        ctx.echo(f"  [box64] moved the old {path} aside to {path}.torch-fl-old")

    def build_from_source(self, ctx: Context) -> None:
        pin = ctx.config.box64.source
        rc, _, _ = ctx.sh(
            "command -v cmake && command -v make && (command -v cc || command -v gcc)"
        )
        if rc != 0:
            apt_install(ctx, self.name, ["cmake", "make", "gcc", "g++", "python3"])
        local = artifacts.fetch(ctx, pin)
        root = prefix_dir(ctx)
        stage = f"{ctx.prefix}/build/box64-{pin.version}"
        # Anything left from an interrupted run is discarded: partial installs are not trusted.
        ctx.sh(f"rm -rf {shlex.quote(root)} {shlex.quote(stage)} && mkdir -p {shlex.quote(stage)}")
        tarball = artifacts.ship(ctx, local, stage, pin.sha256)
        jobs = logic.build_jobs(
            int(ctx.facts.get("cpus") or 1),
            int(ctx.facts.get("mem_mb") or 1024),
            pin.mb_per_job,
        )
        flags = " ".join(shlex.quote(f) for f in logic.cmake_args(list(pin.cmake_extra)))
        s, r = shlex.quote(stage), shlex.quote(root)
        # Install by copying the binary and its x86_64 helper libraries into our prefix rather
        # than `cmake --install`, which writes /etc/binfmt.d and /usr/lib behind our back.
        cmd = (
            f"set -e; cd {s}; tar -xzf {shlex.quote(tarball)} --strip-components=1; "
            f"cmake -S . -B build {flags}; cmake --build build -j {jobs}; "
            f"mkdir -p {r}/bin {r}/lib/x86_64-linux-gnu; cp build/box64 {r}/bin/box64.tmp; "
            f"mv -f {r}/bin/box64.tmp {r}/bin/box64; "
            f"if [ -d x64lib ]; then cp -a x64lib/. {r}/lib/x86_64-linux-gnu/; fi"
        )
        rc, log = ctx.run_long(self.name, cmd, timeout=3 * 3600)
        if rc != 0:
            raise StepError(f"building box64 {pin.version} failed (rc {rc}); see {log}")
        rc, out, _ = ctx.sh(f"sha256sum {r}/bin/box64")
        ctx.write_marker(
            f"{root}/{MARKER}",
            {"version": pin.version, "source_sha256": pin.sha256, "sha256": out.split()[0]},
        )
        ctx.sh(f"rm -rf {s}")


STEP = Box64Step()

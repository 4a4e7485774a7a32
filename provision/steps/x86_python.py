"""The x86_64 Python that runs hbdk4: a native venv on x86_64 hosts, an x86_64 CPython under
box64 on aarch64 boards (pinned tarball, --artifacts, or the distro's multiarch interpreter)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from provision import artifacts, wheels
from provision.context import Context
from provision.floor import light
from provision.results import NEEDED, OK, CheckResult, Inputs, StepError, X86PythonFound
from provision.steps.prereqs import apt_install

MARKER = ".complete.json"
NO_HBDK4 = "hbdk4 not provided: compiled partitions will run on the host"
_ID_SNIPPET = "import platform,sys; print('TFL_PY', platform.machine(), platform.python_version())"
# What the compile worker does before `import hbdk4.compiler` (shims, libhbtl preload); shipped
# to the target to prove the import the same way.
GUEST = light.path_of("bpu.drivers.hbdk4_guest")
SHIMS_PTH = "torch_fl_hbdk4_shims.pth"


def root_dir(ctx: Context) -> str:
    return f"{ctx.prefix}/x86-python"


def emulated(ctx: Context) -> bool:
    return ctx.arch == "aarch64"


def runner(ctx: Context, inputs: Inputs, python: str, guest_libs: str = "") -> str:
    """Command prefix that runs the x86_64 python on this target with a clean environment."""
    clean = "env -u PYTHONPATH -u PYTHONHOME -u PYTHONSTARTUP"
    if not emulated(ctx):
        return f"{clean} {shlex.quote(python)}"
    if inputs.box64 is None:
        raise StepError("no usable box64: run the box64 step first")
    box64 = inputs.box64.path
    libs = f"BOX64_LD_LIBRARY_PATH={shlex.quote(guest_libs)} " if guest_libs else ""
    return f"{clean} BOX64_NOBANNER=1 BOX64_LOG=0 {libs}{shlex.quote(box64)} {shlex.quote(python)}"


def identify(
    ctx: Context, inputs: Inputs, python: str, guest_libs: str = ""
) -> tuple[str | None, str]:
    """(python version, raw output) if `python` runs and is an x86_64 interpreter."""
    try:
        cmd = f"{runner(ctx, inputs, python, guest_libs)} -c {shlex.quote(_ID_SNIPPET)}"
    except StepError as exc:
        return None, str(exc)
    rc, out, err = ctx.sh(cmd, timeout=300)
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "TFL_PY" and parts[1] == "x86_64":
            return parts[2], line
    return None, (out + err).strip()[-300:]


def find_distro_python(ctx: Context) -> str | None:
    """An x86_64 ELF interpreter among the configured candidates (e_machine 0x3e)."""
    for cand in ctx.config.x86_python.distro.candidates:
        q = shlex.quote(cand)
        rc, out, _ = ctx.sh(
            f'f=$(readlink -f {q} 2>/dev/null) && [ -f "$f" ] && '
            f'od -An -tx1 -j18 -N2 "$f" | tr -d " \\n"'
        )
        if rc == 0 and out.strip() == "3e00":
            return cand
    return None


class X86Python:
    name = "x86_python"
    title = "x86_64 Python for hbdk4"
    requires = ("box64",)

    def expected_wheels(self, ctx: Context) -> dict[str, str] | None:
        if ctx.options.oe_wheels is None:
            return None
        try:
            return wheels.list_wheels(ctx.options.oe_wheels)
        except ValueError as exc:
            raise StepError(str(exc)) from exc

    def check(self, ctx: Context, inputs: Inputs) -> CheckResult:
        root = root_dir(ctx)
        marker = ctx.read_marker(f"{root}/{MARKER}")
        facts: dict[str, Any] = {"root": root, "emulated": emulated(ctx)}
        if marker is None:
            rc, out, _ = ctx.sh(f"test -e {shlex.quote(root)} && echo exists")
            if out.strip() == "exists":
                return CheckResult(NEEDED, facts, f"partial install at {root}: will redo")
            return CheckResult(NEEDED, facts, "no x86_64 python installed")
        python, libs = marker["python"], marker.get("guest_libs", "")
        version, raw = identify(ctx, inputs, python, libs)
        facts.update(python=python, kind=marker.get("kind"), version=version)
        if version is None:
            return CheckResult(NEEDED, facts, f"{python} does not run as x86_64 python: {raw}")
        expected = self.expected_wheels(ctx)
        if expected is not None and marker.get("wheels") != expected:
            return CheckResult(NEEDED, facts, "--oe-wheels differ from the installed hbdk4")
        if marker.get("hbdk4"):
            rc, out, _ = ctx.sh(
                f"{runner(ctx, inputs, python, libs)} -c "
                + shlex.quote("import importlib.util as u; print(u.find_spec('hbdk4') is not None)")
            )
            if out.strip() != "True":
                return CheckResult(NEEDED, facts, "hbdk4 recorded but no longer installed")
        found = X86PythonFound(python, libs, bool(marker.get("hbdk4")))
        facts.update(hbdk4=bool(marker.get("hbdk4")), wheels=marker.get("wheels") or {})
        for name, sha in (marker.get("wheels") or {}).items():
            ctx.recorded_artifacts.append({"name": name, "sha256": sha})
        hb = f"hbdk4 {marker.get('hbdk4_version')}" if marker.get("hbdk4") else NO_HBDK4
        return CheckResult(OK, facts, f"python {version} ({marker.get('kind')}); {hb}", found)

    # -- apply -----------------------------------------------------------------------------
    def apply(self, ctx: Context, before: CheckResult, inputs: Inputs) -> None:
        expected = self.expected_wheels(ctx)
        root = root_dir(ctx)
        ctx.sh(f"rm -rf {shlex.quote(root)} && mkdir -p {shlex.quote(root)}")
        if not emulated(ctx):
            kind, python, libs = self.native_venv(ctx, root)
        else:
            kind, python, libs = self.emulated_python(ctx, root, expected is not None)
        version, raw = identify(ctx, inputs, python, libs)
        if version is None:
            raise StepError(f"{python} does not run as an x86_64 python: {raw}")
        record: dict[str, Any] = {"kind": kind, "python": python, "guest_libs": libs}
        record["wheels"] = expected or {}
        record["hbdk4"] = False
        if expected:
            record["hbdk4_version"] = self.install_hbdk4(ctx, inputs, root, python, libs)
            record["hbdk4"] = True
        else:
            ctx.echo(f"  [x86_python] {NO_HBDK4}")
        ctx.write_marker(f"{root}/{MARKER}", record)

    def native_venv(self, ctx: Context, root: str) -> tuple[str, str, str]:
        base = ctx.config.x86_python.native_python
        venv = f"{root}/venv"
        rc, log = ctx.run_long(
            self.name, f"{shlex.quote(base)} -m venv {shlex.quote(venv)}", timeout=600
        )
        if rc != 0:
            raise StepError(f"creating a venv with {base} failed; see {log} (python3-venv?)")
        return "native-venv", f"{venv}/bin/python", ""

    def emulated_python(self, ctx: Context, root: str, want_wheels: bool) -> tuple[str, str, str]:
        cfg = ctx.config.x86_python
        source = cfg.source
        pin = cfg.tarball
        if source == "auto":
            if artifacts.locate(ctx, pin) is not None:
                source = "tarball"
            elif not want_wheels and find_distro_python(ctx):
                source = "distro"
            else:
                source = "tarball"
        if source == "distro":
            if want_wheels:
                raise StepError(
                    "hbdk4 wheels need the self-contained x86_64 CPython: set "
                    "x86_python.source: tarball (offline: put "
                    f"{pin.filename} into --artifacts)"
                )
            python = find_distro_python(ctx)
            if python is None:
                rc, _, _ = ctx.sh("dpkg --add-architecture amd64 2>/dev/null || true")
                apt_install(ctx, self.name, list(cfg.distro.packages))
                python = find_distro_python(ctx)
            if python is None:
                raise StepError(
                    "no x86_64 interpreter among x86_python.distro.candidates after installing "
                    f"{list(cfg.distro.packages)}; add its path to the candidates"
                )
            return "distro", python, ""
        local = artifacts.fetch(ctx, pin)
        remote = artifacts.ship(ctx, local, f"{root}/download", pin.sha256)
        r = shlex.quote(root)
        rc, log = ctx.run_long(
            self.name,
            f"set -e; cd {r}; tar -xzf {shlex.quote(remote)}; rm -rf download",
            timeout=1800,
        )
        if rc != 0:
            raise StepError(f"unpacking {pin.filename} failed; see {log}")
        major_minor = ".".join(pin.version.split(".")[:2])
        return "tarball", f"{root}/python/bin/python{major_minor}", f"{root}/python/lib"

    def install_hbdk4(self, ctx: Context, inputs: Inputs, root: str, python: str, libs: str) -> str:
        assert ctx.options.oe_wheels is not None
        stage = f"{root}/wheels"
        shipped = []
        for wheel in sorted(ctx.options.oe_wheels.glob("*.whl")):
            shipped.append(artifacts.ship(ctx, wheel, stage))
        wanted = {wheels.normalize(n) for n in ctx.config.x86_python.hbdk4_requirements}
        provided = {wheels.wheel_project(Path(p).name) for p in shipped}
        missing = wanted - provided
        if missing:
            raise StepError(
                f"--oe-wheels lacks {sorted(missing)}; copy those wheels from the OE package"
            )
        run = runner(ctx, inputs, python, libs)
        pip = f"{run} -m pip install --disable-pip-version-check --find-links {shlex.quote(stage)}"
        files = " ".join(shlex.quote(p) for p in shipped)
        if emulated(ctx):
            reqs: list[str] = []
            for wheel in sorted(ctx.options.oe_wheels.glob("*.whl")):
                reqs += wheels.requires_dist(wheel)
            install, shimmed = wheels.split_requirements(reqs, provided)
            cmd = f"set -e; {pip} --no-deps {files}"
            if install:
                cmd += "; " + pip + " " + " ".join(shlex.quote(r) for r in sorted(set(install)))
            self.install_shims(ctx, run, python)
            ctx.echo(f"  [x86_python] import shims replace: {sorted(set(shimmed)) or 'none'}")
        else:
            cmd = f"{pip} {files}"
        rc, log = ctx.run_long(self.name, cmd, timeout=3600)
        if rc != 0:
            raise StepError(f"installing the hbdk4 wheels failed; see {log}")
        timeout = ctx.config.x86_python.import_timeout_s
        guest = f"{root}/{GUEST.name}"
        ctx.target.put(GUEST, guest)
        check = f"{run} {shlex.quote(guest)} check {int(emulated(ctx))} {shlex.quote(libs)}"
        rc, out, err = ctx.sh(check, timeout=timeout)
        for line in out.splitlines():
            if line.startswith("TFL_HBDK4 "):
                return line.split(" ", 1)[1].strip()
        raise StepError(
            f"`import hbdk4.compiler` failed under {'box64' if emulated(ctx) else 'python'} "
            f"(rc {rc}): {(out + err).strip()[-600:]}"
        )

    def install_shims(self, ctx: Context, run: str, python: str) -> None:
        """hbdk4_guest.py into site-packages, enabled at interpreter start by a .pth line: anyone
        importing hbdk4 with this Python gets the shims, as the compile worker does."""
        rc, out, err = ctx.sh(
            f"{run} -c " + shlex.quote("import sysconfig; print(sysconfig.get_paths()['purelib'])")
        )
        site = out.strip().splitlines()[-1] if rc == 0 and out.strip() else ""
        if not site:
            raise StepError(f"cannot find site-packages of {python}: {err.strip()[-300:]}")
        ctx.target.put(GUEST, f"{site}/{GUEST.name}")
        ctx.write_file_atomic(
            f"{site}/{SHIMS_PTH}", "import hbdk4_guest; hbdk4_guest.install_shims()\n"
        )


STEP = X86Python()

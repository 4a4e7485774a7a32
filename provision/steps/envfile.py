"""The per-user env file torch_fl reads by itself; its format lives in torch_fl/envfile.py."""

from __future__ import annotations

import base64
import shlex
import time

from provision import facts as facts_mod
from provision.context import Context
from provision.floor import light
from provision.results import NEEDED, OK, CheckResult, Inputs, StepError

MARCHES: tuple[str, ...] = light.load("targets").MARCHES
envfile_format = light.load("envfile")


class EnvFile:
    name = "envfile"
    title = "environment file"
    requires = ("box64", "x86_python", "vendor_runtime")

    def march(self, ctx: Context) -> str:
        march = ctx.config.march
        if march != "auto":
            return march  # validated against MARCHES with the configuration
        detected = facts_mod.march_for(ctx.facts)
        if detected is None:
            return ctx.config.default_march
        if detected not in MARCHES:
            # Written to the env file it would make every torch.compile(backend="bpu") fail.
            raise StepError(
                f"the board ({ctx.facts.get('board_model')}) has a {detected} BPU, which the bpu "
                f"compile backend does not target (it compiles for {', '.join(MARCHES)}); "
                "set `march:` in --config if the board really has one of those, or "
                "--skip envfile"
            )
        return detected

    def desired(self, ctx: Context, inputs: Inputs) -> dict[str, str]:
        values = {
            "FLAGOS_BPU_MARCH": self.march(ctx),
            "FLAGOS_BPU_CACHE": ctx.expand(ctx.config.cache_dir),
        }
        x86, box64 = inputs.x86_python, inputs.box64
        if x86 is not None:
            values["FLAGOS_BPU_X86_PYTHON"] = x86.python
        if ctx.arch == "aarch64" and box64 is not None:
            values["FLAGOS_BPU_EMULATOR"] = box64.path
            libs = [x86.guest_libs if x86 else "", box64.guest_libs]
            if any(libs):
                values["FLAGOS_BPU_GUEST_LIBS"] = ":".join(p for p in libs if p)
        if inputs.vendor_runtime is not None:
            values["FLAGOS_BPU_UCP_LIB"] = inputs.vendor_runtime.ucp_lib
        return values

    def _read(self, ctx: Context, path: str) -> tuple[str, str]:
        """(state, text): state is `missing`, `file` or `other` (a directory, a socket...).

        The bytes travel base64-encoded: the file may hold anything, and a shell round trip of
        non-UTF-8 bytes would fail to decode here before it could be repaired.
        """
        quoted = shlex.quote(path)
        rc, out, _ = ctx.sh(
            f"if [ -f {quoted} ]; then echo file; base64 < {quoted}; "
            f"elif [ -e {quoted} ] || [ -L {quoted} ]; then echo other; else echo missing; fi"
        )
        state, _, encoded = out.partition("\n")
        if rc != 0 or state not in ("file", "other", "missing"):
            return "other", ""
        if state != "file":
            return state, ""
        try:
            return "file", base64.b64decode("".join(encoded.split())).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            return "file", "\ufffd"  # not UTF-8 text: parse_env_text rejects it below

    def check(self, ctx: Context, inputs: Inputs) -> CheckResult:
        path = ctx.facts["env_file"]
        want = self.desired(ctx, inputs)
        state, out = self._read(ctx, path)
        facts = {"path": path, "values": want, "state": state}
        if state == "missing":
            return CheckResult(NEEDED, facts, f"{path} missing")
        if state == "other":
            return CheckResult(NEEDED, facts, f"{path} is not a regular file: will move it aside")
        try:
            # torch_fl's own reader: a file it would refuse is rewritten, not left to fail later
            have = envfile_format.parse_env_text(out, source=path)
        except ValueError as exc:
            return CheckResult(NEEDED, facts, f"torch_fl cannot read it ({exc}): will rewrite")
        diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
        if diff:
            facts["differs"] = diff
            return CheckResult(NEEDED, facts, f"{path} differs in {', '.join(diff)}")
        return CheckResult(OK, facts, f"{path} up to date ({len(want)} settings)")

    def apply(self, ctx: Context, before: CheckResult, inputs: Inputs) -> None:
        path = ctx.facts["env_file"]
        if before.facts.get("state") == "other":
            # A directory (or socket...) in the file's place: keep it under another name rather
            # than delete what a user may have put there, then write the file.
            aside = f"{path}.replaced-{time.strftime('%Y%m%d-%H%M%S')}"
            rc, _, err = ctx.sh(f"mv -f {shlex.quote(path)} {shlex.quote(aside)}")
            if rc != 0:
                raise StepError(f"{path} is not a regular file and moving it aside failed: {err}")
            ctx.echo(f"moved {path} (not a regular file) to {aside}")
        text = envfile_format.render_env_text(before.facts["values"])
        ctx.write_file_atomic(path, text)


STEP = EnvFile()

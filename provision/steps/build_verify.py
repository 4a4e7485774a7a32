"""Build the extension and prove `torch.compile(backend="bpu")` works, reporting the executor.

The proof is a real compile of a small conv net, compared with eager; the check re-runs it every
time (nothing is trusted from an earlier run), which is why it is the slowest check.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

from provision.context import Context
from provision.results import NEEDED, OK, CheckResult, Inputs, StepError, not_applicable

PROJECT_ROOT = Path(__file__).resolve().parents[2]
MIN_COSINE = 0.98

VERIFY_SNIPPET = r"""
import json, traceback
res = {"ok": False}
try:
    import torch
    import torch_fl
    res["torch"] = torch.__version__
    import torch._dynamo
    res["backend_registered"] = "bpu" in torch._dynamo.list_backends()
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 4, 3, padding=1), torch.nn.ReLU()).eval()
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        ref = net(x)
        compiled = torch.compile(net, backend="bpu")
        out = compiled(x)
    res["max_abs_err"] = float((out - ref).abs().max())
    res["cosine"] = float(torch.nn.functional.cosine_similarity(
        out.flatten().double(), ref.flatten().double(), dim=0))
    # What ran the partitions (hbm on a board with its runtime, sim, eager), from explain()'s
    # report of the compiled model on the same input.
    try:
        import torch_fl.bpu as bpu
        with torch.no_grad():
            report = bpu.explain(compiled, x)
        executor = ", ".join(sorted({p.executor for p in report.partitions})) or "no partition"
    except Exception as exc:
        executor = "unknown (explain failed: %s)" % str(exc)[:200]
    res["executor"] = executor
    res["ok"] = res["cosine"] >= __MIN_COSINE__
except Exception:
    res["error"] = traceback.format_exc()[-1500:]
print("TFL_VERIFY " + json.dumps(res))
""".replace("__MIN_COSINE__", repr(MIN_COSINE))


def parse_verify(out: str) -> dict[str, Any] | None:
    for line in out.splitlines():
        if line.startswith("TFL_VERIFY "):
            try:
                return json.loads(line[len("TFL_VERIFY ") :])
            except ValueError:
                return None
    return None


def summarize(res: dict[str, Any] | None, raw: str) -> str:
    if res is None:
        return f"verify snippet printed no result: {raw.strip()[-300:]}"
    if res.get("error"):
        return "verify failed: " + res["error"].strip().splitlines()[-1][:300]
    return (
        f"backend=bpu cosine {res.get('cosine', 0):.4f} max|err| {res.get('max_abs_err', 0):.3g} "
        f"executor: {res.get('executor')}"
    )


# On a board the library was built by the torch_fl step; the proof compiles under both
# executors a board without hbdk4 runs: eager (exact) and the int8 simulator.
BOARD_EXECUTORS = ("eager", "sim")


class BuildVerify:
    name = "build_verify"
    title = "build extension and verify torch.compile(backend='bpu')"
    requires: tuple[str, ...] = ("torch_fl",)

    def python(self, ctx: Context) -> str:
        return sys.executable

    def run_snippet(self, ctx: Context, python: str, prefix: str = "") -> tuple[dict | None, str]:
        rc, out, err = ctx.sh(
            f"{prefix}{shlex.quote(python)} -c {shlex.quote(VERIFY_SNIPPET)}",
            timeout=ctx.config.build_verify.timeout_s,
        )
        res = parse_verify(out)
        return res, summarize(res, out + err)

    def check(self, ctx: Context, inputs: Inputs) -> CheckResult:
        if not ctx.target.is_local:
            return self.check_board(ctx, inputs)
        py = self.python(ctx)
        res, detail = self.run_snippet(ctx, py, f"cd {shlex.quote(str(PROJECT_ROOT))} && ")
        facts = {"python": py, "result": res}
        if res is not None and res.get("ok"):
            return CheckResult(OK, facts, detail)
        return CheckResult(NEEDED, facts, detail)

    def check_board(self, ctx: Context, inputs: Inputs) -> CheckResult:
        """On a remote target: the installed library, from outside the sources, per executor."""
        if inputs.torch_fl is None:
            return not_applicable(
                "remote target without torch-fl: the torch_env and torch_fl steps install it"
            )
        python = inputs.torch_fl.python
        results, details = {}, []
        for executor in BOARD_EXECUTORS:
            res, detail = self.run_snippet(
                ctx, python, f"cd / && env -u PYTHONPATH FLAGOS_BPU_EXECUTOR={executor} "
            )
            results[executor] = res
            details.append(f"{executor}: {detail}")
        facts = {"python": python, "result": results}
        ok = all(r is not None and r.get("ok") for r in results.values())
        return CheckResult(OK if ok else NEEDED, facts, "; ".join(details))

    def build_command(self, ctx: Context) -> str:
        py = shlex.quote(self.python(ctx))
        cfg = ctx.config.build_verify
        rc, out, _ = ctx.sh(
            f"cd {shlex.quote(str(PROJECT_ROOT))} && {py} -m invoke --list", timeout=120
        )
        if rc == 0 and any(ln.split()[:1] == ["build"] for ln in out.splitlines()):
            return cfg.build_command.format(python=py)
        if (PROJECT_ROOT / "pyproject.toml").exists() or (PROJECT_ROOT / "setup.py").exists():
            return cfg.fallback_build_command.format(python=py)
        raise StepError(
            f"{PROJECT_ROOT} has no `invoke build` task and no pyproject.toml/setup.py yet: "
            "the extension cannot be built; skip this step (--skip build_verify) until it can"
        )

    def apply(self, ctx: Context, before: CheckResult, inputs: Inputs) -> None:
        if not ctx.target.is_local:
            # Nothing to build here: the torch_fl step built it; a failing proof is the answer.
            raise StepError(f"torch.compile(backend='bpu') fails on the board: {before.detail}")
        cmd = f"cd {shlex.quote(str(PROJECT_ROOT))} && {self.build_command(ctx)}"
        rc, log = ctx.run_long(self.name, cmd, timeout=ctx.config.build_verify.timeout_s)
        if rc != 0:
            raise StepError(f"building the extension failed (rc {rc}); see {log}")


STEP = BuildVerify()

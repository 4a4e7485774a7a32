"""Plan from checks, apply what is needed, re-check: the whole provisioning loop."""

from __future__ import annotations

import time
from dataclasses import dataclass

from provision.config import STEP_NAMES
from provision.steps import FAILED, NEEDED, OK, CheckResult, Context, Step, StepError


@dataclass
class Outcome:
    name: str
    title: str
    before: CheckResult | None = None
    action: str = "not run"
    after: CheckResult | None = None
    duration_s: float = 0.0
    error: str | None = None

    @property
    def final(self) -> CheckResult | None:
        return self.after or self.before


def select(only: str | None, skip: str | None, config_skip: list[str]) -> list[str]:
    """Step names to run, in pipeline order; unknown names are bad input (ValueError)."""

    def names(text: str | None, flag: str) -> list[str]:
        items = [s.strip().replace("-", "_") for s in (text or "").split(",") if s.strip()]
        bad = [s for s in items if s not in STEP_NAMES]
        if bad:
            raise ValueError(f"{flag}: unknown step(s) {bad}; steps are {', '.join(STEP_NAMES)}")
        return items

    chosen = names(only, "--only") or list(STEP_NAMES)
    dropped = set(names(skip, "--skip")) | set(config_skip)
    if only:
        dropped -= set(chosen)  # an explicit --only wins over the config's skip list
        dropped |= set(names(skip, "--skip"))
    return [s for s in STEP_NAMES if s in chosen and s not in dropped]


def _check(step: Step, ctx: Context) -> CheckResult:
    try:
        return step.check(ctx)
    except StepError as exc:
        return CheckResult(FAILED, {}, str(exc))


def dry_run(ctx: Context, steps: list[Step]) -> list[Outcome]:
    outcomes = []
    pending: str | None = None
    for step in steps:
        start = time.monotonic()
        before = _check(step, ctx)
        if before.status == OK:
            action = "none"
        elif before.status == NEEDED:
            action = "would apply"
            pending = pending or step.name
        else:
            action = f"after {pending}" if pending else "cannot fix"
        outcomes.append(
            Outcome(step.name, step.title, before, action, None, time.monotonic() - start)
        )
    return outcomes


def apply_run(ctx: Context, steps: list[Step]) -> list[Outcome]:
    outcomes = []
    failed = False
    for step in steps:
        out = Outcome(step.name, step.title)
        outcomes.append(out)
        if failed:
            out.action = "not run"
            continue
        start = time.monotonic()
        out.before = _check(step, ctx)
        if out.before.status == OK:
            out.action = "none"
        elif out.before.status == FAILED:
            # failed = apply cannot fix it (bad box64.path, broken vendor runtime, probe abort)
            out.action = "none"
            out.error = out.before.detail
            failed = True
        else:
            ctx.echo(f"[{step.name}] {out.before.detail} -> applying")
            out.action = "apply"
            try:
                step.apply(ctx, out.before)
            except StepError as exc:
                out.error = str(exc)
            out.after = _check(step, ctx)
            if out.after.status != OK:
                failed = True
                out.error = out.error or out.after.detail
        out.duration_s = time.monotonic() - start
        ctx.echo(f"[{step.name}] {(out.final or out.before).status}: {(out.final).detail}")
    return outcomes


def exit_code(outcomes: list[Outcome], dry: bool) -> int:
    if dry:
        return 0
    bad = any(
        o.error or (o.final and o.final.status != OK) for o in outcomes if o.action != "not run"
    )
    return 1 if bad or any(o.action == "not run" for o in outcomes) else 0

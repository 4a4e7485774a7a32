"""Plan from checks, apply what is needed, re-check: the whole provisioning loop."""

from __future__ import annotations

import time
from dataclasses import dataclass

from provision.context import Context, Step
from provision.results import FAILED, NEEDED, OK, CheckResult, Inputs, StepError
from provision.steps import STEP_NAMES, all_steps


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


def _check(step: Step, ctx: Context, inputs: Inputs) -> CheckResult:
    try:
        return step.check(ctx, inputs)
    except StepError as exc:
        return CheckResult(FAILED, {}, str(exc))


def inputs_for(ctx: Context, step: Step, results: dict[str, CheckResult] | None = None) -> Inputs:
    """The results of the steps `step` requires, taken from `results` (this run's checks).

    A required step that did not run (left out by --only/--skip) is checked now, read-only, and
    its result added to `results`, so a step never has to call another step itself.
    """
    results = {} if results is None else results
    known = {s.name: s for s in all_steps()}
    found = {}
    for name in step.requires:
        if name not in results:
            required = known[name]
            results[name] = _check(required, ctx, inputs_for(ctx, required, results))
        found[name] = results[name].provides
    return Inputs(**found)


def dry_run(ctx: Context, steps: list[Step]) -> list[Outcome]:
    outcomes = []
    results: dict[str, CheckResult] = {}
    pending: str | None = None
    for step in steps:
        start = time.monotonic()
        before = results[step.name] = _check(step, ctx, inputs_for(ctx, step, results))
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
    results: dict[str, CheckResult] = {}
    failed = False
    for step in steps:
        out = Outcome(step.name, step.title)
        outcomes.append(out)
        if failed:
            out.action = "not run"
            continue
        start = time.monotonic()
        inputs = inputs_for(ctx, step, results)
        out.before = _check(step, ctx, inputs)
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
                step.apply(ctx, out.before, inputs)
            except StepError as exc:
                out.error = str(exc)
            out.after = _check(step, ctx, inputs)
            if out.after.status != OK:
                failed = True
                out.error = out.error or out.after.detail
        results[step.name] = out.final or out.before
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

"""Plan from checks, apply what is needed, re-check: the whole provisioning loop."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from provision.context import Context, Step
from provision.floor import exitcodes, progress
from provision.results import FAILED, NEEDED, OK, CheckResult, Inputs, StepError
from provision.steps import STEP_NAMES, all_steps

INTERRUPTED_ACTION = "interrupted"


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


def select(only: str | None, skip: str | None, config_skip: Sequence[str]) -> list[str]:
    """Step names to run, in pipeline order; unknown names are bad input (ValueError)."""

    def names(text: str | None, flag: str) -> list[str]:
        items = [s.strip().replace("-", "_") for s in (text or "").split(",") if s.strip()]
        bad = [s for s in items if s not in STEP_NAMES]
        if bad:
            raise ValueError(f"{flag}: unknown step(s) {bad}; steps are {', '.join(STEP_NAMES)}")
        return items

    if only is not None and not names(only, "--only"):
        raise ValueError(f"--only {only!r} names no step; steps are {', '.join(STEP_NAMES)}")
    if skip is not None and not names(skip, "--skip"):
        raise ValueError(f"--skip {skip!r} names no step; steps are {', '.join(STEP_NAMES)}")
    both = sorted(set(names(only, "--only")) & set(names(skip, "--skip")))
    if both:
        raise ValueError(
            f"--only and --skip both name {', '.join(both)}; keep each step in one of them"
        )
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
    """Check, apply what is needed, re-check; a Ctrl-C/SIGTERM ends the run at the current step.

    The interrupted step is marked `interrupted` and the rest `not run`; every install writes its
    completion marker last, so the next run finds a half-done step partial and redoes it.
    """
    outcomes = []
    results: dict[str, CheckResult] = {}
    failed = stopped = False
    for step in steps:
        out = Outcome(step.name, step.title)
        outcomes.append(out)
        if failed or stopped:
            out.action = "not run"
            continue
        start = time.monotonic()
        try:
            _apply_one(ctx, step, out, results)
        except KeyboardInterrupt:
            out.action = INTERRUPTED_ACTION
            out.error = "interrupted (Ctrl-C/SIGTERM); re-run to resume"
            stopped = True
        out.duration_s = time.monotonic() - start
        if not stopped:
            failed = out.final is not None and out.final.status != OK
            ctx.echo(f"[{step.name}] {(out.final or out.before).status}: {(out.final).detail}")
    return outcomes


def _apply_one(ctx: Context, step: Step, out: Outcome, results: dict[str, CheckResult]) -> None:
    inputs = inputs_for(ctx, step, results)
    out.before = _check(step, ctx, inputs)
    if out.before.status == OK:
        out.action = "none"
    elif out.before.status == FAILED:
        # failed = apply cannot fix it (bad box64.path, broken vendor runtime, probe abort)
        out.action = "none"
        out.error = out.before.detail
    else:
        ctx.echo(f"[{step.name}] {out.before.detail} -> applying")
        out.action = "apply"
        with progress.heartbeat(f"provision {step.name}", stream=sys.stdout):
            try:
                step.apply(ctx, out.before, inputs)
            except StepError as exc:
                out.error = str(exc)
        out.after = _check(step, ctx, inputs)
        if out.after.status != OK:
            out.error = out.error or out.after.detail
    results[step.name] = out.final or out.before


def interrupted(outcomes: list[Outcome]) -> Outcome | None:
    """The step a Ctrl-C/SIGTERM stopped, if any."""
    return next((o for o in outcomes if o.action == INTERRUPTED_ACTION), None)


def exit_code(outcomes: list[Outcome], dry: bool) -> int:
    if interrupted(outcomes):
        return exitcodes.INTERRUPTED
    if dry:
        return exitcodes.OK
    bad = any(
        o.error or (o.final and o.final.status != OK) for o in outcomes if o.action != "not run"
    )
    failed = bad or any(o.action == "not run" for o in outcomes)
    return exitcodes.FAILED if failed else exitcodes.OK

"""One target from gathered facts to a written report: the part every way of provisioning shares
(`invoke provision` on this machine or one host, several hosts in parallel, the farm)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision import plan, scratch
from provision import report as report_mod
from provision.context import Context, Options
from provision.floor import locks
from provision.settings import Settings
from provision.steps import all_steps
from provision.target import Target


@dataclass
class Run:
    outcomes: list[plan.Outcome]
    exit_code: int
    report: dict[str, Any]


class Busy(Exception):
    """Another provisioning run holds this target (bad timing, not a failed step)."""


@contextlib.contextmanager
def exclusive(target_name: str) -> Iterator[None]:
    """One provisioning run per target at a time: two at once (two shells, two checkouts, one
    host alone and in a list) would run apt, builds and installs into the same places side by
    side. An flock in the controller's cache, so it ends with its process however that ends;
    dry runs, which change nothing, take none."""
    path = (
        scratch.controller_cache()
        / "locks"
        / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', target_name)}.lock"
    )
    busy = Busy(
        f"another provisioning run of {target_name} is in progress (it holds {path}); "
        "wait for it to finish, then run this one again"
    )
    with locks.held(path, lambda: busy):
        yield


def describe(facts: dict[str, Any], dry: bool) -> str:
    """One line about the target, printed before its steps."""
    return (
        f"{facts.get('arch')} {facts.get('distro')} {facts.get('distro_version')} "
        f"glibc {facts.get('glibc')} page {facts.get('pagesize')}{' (dry run)' if dry else ''}"
    )


def run_steps(
    target: Target,
    facts: dict[str, Any],
    *,
    cfg: Settings,
    selected: list[str],
    options: Options,
    report_path: Path,
    log_dir: Path,
    work_dir: Path,
    started: float,
    echo: Callable[[str], None] = print,
) -> Run:
    """Run the selected steps (planned only when options.dry); write the validated report."""
    ctx = Context(target, facts, cfg, options, log_dir, work_dir, echo=echo)
    steps = [s for s in all_steps() if s.name in selected]
    if options.dry:
        outcomes = plan.dry_run(ctx, steps)
    else:
        with exclusive(target.name):
            outcomes = plan.apply_run(ctx, steps)
    code = plan.exit_code(outcomes, options.dry)
    doc = report_mod.build(
        target=target.name,
        local=target.is_local,
        dry=options.dry,
        started=started,
        facts=facts,
        outcomes=outcomes,
        artifacts=ctx.recorded_artifacts,
        exit_code=code,
        config=cfg,
    )
    report_mod.validate(doc)
    report_mod.write_atomic(report_path, doc)
    return Run(outcomes, code, doc)

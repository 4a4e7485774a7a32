"""`invoke provision`: take this machine or a board (--host) to a state where torch-fl builds and
`torch.compile(backend="bpu")` compiles, and prove it. Exit 0 done, 1 a step failed, 2 bad input."""

from __future__ import annotations

import re
import time
from pathlib import Path

from invoke import Collection, task
from invoke.exceptions import Exit

from provision import config as config_mod
from provision import facts as facts_mod
from provision import multihost, plan
from provision import report as report_mod
from provision.steps import Context, Options, all_steps
from provision.target import LocalTarget, SshTarget, TargetError

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def _bad_input(message: str) -> Exit:
    return Exit(message=f"provision: {message}", code=2)


def _controller_cache() -> Path:
    import os

    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "torch-fl" / "provision"


@task(
    iterable=["host"],
    help={
        "host": "provision user@addr[:port] over SSH instead of this machine; several "
        "(a,b or repeated --host) run in parallel",
        "dry": "print the plan, change nothing",
        "only": "comma-separated steps to run (others skipped)",
        "skip": "comma-separated steps to skip",
        "artifacts": "directory with pinned tarballs/probe (offline boards; checked by sha256)",
        "oe-wheels": "directory with the vendor OE package's hbdk4 wheels",
        "report": "JSON report path (default out/provision/<target>.json)",
        "insecure-host-key": "accept an unknown SSH host key (throwaway test hosts only)",
        "config": "YAML file overriding provision/provision.yaml",
    },
)
def provision(
    c,
    host=None,
    dry=False,
    only=None,
    skip=None,
    artifacts=None,
    oe_wheels=None,
    insecure_host_key=False,
    config=None,
    report=None,
):
    """Provision this machine or a board; see docs/provisioning.md."""
    started = time.time()
    try:
        section = c.config.get("provision") if hasattr(c, "config") else None
        cfg = config_mod.load(config, dict(section) if section else None)
        selected = plan.select(only, skip, cfg["steps"]["skip"])
        specs = multihost.split_hosts(host)
        spec = specs[0] if len(specs) == 1 else None
        art_dir = Path(artifacts).expanduser() if artifacts else None
        if art_dir is not None and not art_dir.is_dir():
            raise ValueError(f"--artifacts {artifacts} is not a directory")
        wheel_dir = Path(oe_wheels).expanduser() if oe_wheels else None
        if wheel_dir is not None:
            from provision.wheels import list_wheels

            list_wheels(wheel_dir)
    except (config_mod.ConfigError, ValueError) as exc:
        raise _bad_input(str(exc)) from exc

    if len(specs) > 1:
        out_dir = Path(report).parent if report else PROJECT_ROOT / "out" / "provision"
        code = multihost.run_cli(
            specs,
            cfg=cfg,
            selected=selected,
            options=Options(artifacts=art_dir, oe_wheels=wheel_dir, dry=dry),
            insecure_host_key=insecure_host_key,
            out_dir=out_dir,
            work_root=_controller_cache(),
            combined_path=Path(report) if report else None,
        )
        if code:
            raise Exit(code=code)
        return

    try:
        if spec is None:
            target = LocalTarget()
        else:
            target = SshTarget(
                spec,
                insecure_host_key=insecure_host_key,
                known_hosts=cfg["ssh"]["known_hosts"] or None,
                identity=cfg["ssh"]["identity"] or None,
                connect_timeout=float(cfg["ssh"]["connect_timeout_s"]),
            )
    except TargetError as exc:
        raise Exit(message=f"provision: {exc}", code=1) from exc

    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", target.name)
    out_path = Path(report) if report else PROJECT_ROOT / "out" / "provision" / f"{slug}.json"
    try:
        facts = facts_mod.gather(target)
        ctx = Context(
            target=target,
            facts=facts,
            config=cfg,
            options=Options(artifacts=art_dir, oe_wheels=wheel_dir, dry=dry),
            log_dir=out_path.parent / "logs",
            work_dir=_controller_cache(),
        )
        print(
            f"provision {target.name}: {facts.get('arch')} {facts.get('distro')} "
            f"{facts.get('distro_version')} glibc {facts.get('glibc')} page {facts.get('pagesize')}"
            f"{' (dry run)' if dry else ''}"
        )
        steps = [s for s in all_steps() if s.name in selected]
        outcomes = plan.dry_run(ctx, steps) if dry else plan.apply_run(ctx, steps)
        code = plan.exit_code(outcomes, dry)
        doc = report_mod.build(
            target=target.name,
            local=target.is_local,
            dry=dry,
            started=started,
            facts=facts,
            outcomes=outcomes,
            artifacts=ctx.recorded_artifacts,
            exit_code=code,
            config=cfg,
        )
        report_mod.validate(doc)
        report_mod.write_atomic(out_path, doc)
    finally:
        target.close()
    print(report_mod.table(outcomes))
    print(f"actions: {doc['actions']}  report: {out_path}")
    if code:
        raise Exit(code=code)


def register(ns: Collection) -> None:
    """Add `invoke provision` to the root collection."""
    ns.add_task(provision)

"""`invoke provision`: take this machine or a board (--host) to a state where torch-fl builds and
`torch.compile(backend="bpu")` compiles, and prove it. Exit 0 done, 1 a step failed, 2 bad input, 130 interrupted (Ctrl-C, SIGTERM)."""

from __future__ import annotations

import contextlib
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from invoke import Collection, task
from invoke.exceptions import Exit

from provision import config as config_mod
from provision import facts as facts_mod
from provision import multihost, pipeline, plan, run_inputs, scratch
from provision import report as report_mod
from provision.context import Options
from provision.floor import exitcodes, outpaths
from provision.target import (
    HostSpec,
    LocalTarget,
    SshTarget,
    TargetError,
    TargetInputError,
    check_ssh_files,
    q,
)
from scripts.tasks.cli import CliTask, sigterm_as_interrupt, write_json

PROJECT_ROOT = Path(__file__).resolve().parents[2]
REPORT_DIR = PROJECT_ROOT / "out" / "provision"


def _bad_input(message: str) -> Exit:
    return Exit(message=f"provision: {message}", code=exitcodes.USAGE)


def _report_path(json_flag: str | None, target_name: str, dry: bool) -> Path:
    """The report file; a dry run writes beside the real report, never over it."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", target_name)
    given = json_flag not in (None, "", "-")  # `-`: stdout, and the default file as usual
    path = Path(json_flag).expanduser() if given else REPORT_DIR / f"{slug}.json"
    return path.with_name(f"{path.stem}.dry{path.suffix or '.json'}") if dry else path


def _check_report_path(flag: str, path: Path) -> None:
    problem = outpaths.file_problem(path)
    if problem:
        raise _bad_input(f"{flag} {str(path)!r}: {problem}")


_ENV_DIR_CHECK = (
    'd=$(dirname "$1"); while [ ! -e "$d" ]; do d=$(dirname "$d"); done; '
    'if [ -d "$d" ] && [ -w "$d" ]; then echo ok; else echo "$d"; fi'
)


def _check_env_file_writable(target, facts: dict) -> None:
    """The env file's directory must be writable before any step changes the target."""
    path = str(facts.get("env_file") or "")
    if not path:
        return
    rc, out, _ = target.run(f"sh -c {q(_ENV_DIR_CHECK)} _ {q(path)}", timeout=30)
    blocker = out.strip()
    if rc == 0 and blocker and blocker != "ok":
        raise _bad_input(
            f"the env file {path} cannot be written on {target.name}: {blocker} is not a "
            "writable directory; fix its permissions or set FLAGOS_BPU_ENV_FILE (or "
            "XDG_CONFIG_HOME) to a writable place, or --skip envfile"
        )


@task(
    klass=CliTask,
    honours_dry=True,  # `invoke --dry provision` plans and checks, changing nothing
    short={"host": "H"},
    iterable=["host"],
    help={
        "host": "provision user@addr[:port] over SSH instead of this machine (-H); several "
        "(a,b or repeated --host) run in parallel",
        "dry": "print the plan, change nothing (invoke's own --dry does the same)",
        "only": "comma-separated steps to run (others skipped)",
        "skip": "comma-separated steps to skip",
        "artifacts": "directory with pinned tarballs/probe (offline boards; checked by sha256)",
        "oe-wheels": "directory with the vendor OE package's hbdk4 wheels",
        "json": "JSON report path (default out/provision/<target>.json; dry runs: <name>.dry.json)",
        "report": "older spelling of --json",
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
    json=None,
    report=None,
):
    """Provision this machine or a board; see docs/provisioning.md."""
    with sigterm_as_interrupt():
        _provision(c, host, dry, only, skip, artifacts, oe_wheels, insecure_host_key, config,
                   json, report)  # fmt: skip


@dataclass
class _Request:
    """What the command line asks for, validated."""

    cfg: config_mod.Settings
    selected: list[str]
    specs: list[HostSpec]
    options: Options
    echo: bool
    json_flag: str | None
    flag_name: str


def _provision(c, host, dry, only, skip, artifacts, oe_wheels, insecure_host_key, config, json,
               report):  # fmt: skip
    started = time.time()
    req = _request(c, host, dry, only, skip, artifacts, oe_wheels, config, json, report)
    if len(req.specs) > 1:
        _provision_several(req, insecure_host_key)
    else:
        _provision_one(req, insecure_host_key, started)


def _request(c, host, dry, only, skip, artifacts, oe_wheels, config, json, report) -> _Request:
    """Parse and check every input before anything connects; bad input exits 2."""
    run_cfg = getattr(getattr(c, "config", None), "run", None) or {}
    # invoke's core flags: `invoke --dry provision` plans only, `invoke -e provision` echoes.
    dry = bool(dry or run_cfg.get("dry"))
    for flag, value in (("--artifacts", artifacts), ("--oe-wheels", oe_wheels), ("--json", json),
                        ("--report", report)):  # fmt: skip
        # An empty value ("$UNSET") is a mistake, never "use the default".
        if value is not None and not str(value).strip():
            raise _bad_input(f"{flag} {value!r} is empty; give a path (or leave the flag out)")
        problem = outpaths.lookup_problem(Path(value).expanduser()) if value else None
        if problem and value != "-":
            raise _bad_input(f"{flag} {outpaths.shown(value)}: {problem}")
    if json and report and json != report:
        raise _bad_input("--json and --report are the same option; give one of them")
    json_flag = json or report
    flag_name = "--json" if json else "--report"
    try:
        section = c.config.get("provision") if hasattr(c, "config") else None
        inputs = run_inputs.read(section, config, only, skip, artifacts)
        specs = multihost.split_hosts(host)
        wheel_dir = Path(oe_wheels).expanduser() if oe_wheels else None
        if wheel_dir is not None:
            from provision.wheels import list_wheels

            list_wheels(wheel_dir)
    except (config_mod.ConfigError, ValueError) as exc:
        raise _bad_input(str(exc)) from exc
    if json_flag == "-" and len(specs) > 1:
        raise _bad_input(f"{flag_name} - prints one host's report; give a file for several hosts")
    if json_flag and json_flag != "-":
        _check_report_path(flag_name, Path(json_flag).expanduser())
    options = Options(artifacts=inputs.artifacts, oe_wheels=wheel_dir, dry=dry)
    echo = bool(run_cfg.get("echo"))
    return _Request(inputs.cfg, inputs.steps, specs, options, echo, json_flag, flag_name)


def _provision_several(req: _Request, insecure_host_key: bool) -> None:
    try:
        check_ssh_files(req.cfg.ssh.identity or None, req.cfg.ssh.known_hosts or None)
    except TargetInputError as exc:
        raise _bad_input(str(exc)) from exc
    out_dir = Path(req.json_flag).parent if req.json_flag else REPORT_DIR
    request = multihost.ProvisionRequest(
        req.cfg, tuple(req.selected), req.options, insecure_host_key
    )
    places = multihost.RunPlaces(
        out_dir, scratch.controller_cache(), Path(req.json_flag) if req.json_flag else None
    )
    code = multihost.run_cli(req.specs, request, places)
    if code:
        raise Exit(code=code)


def _provision_one(req: _Request, insecure_host_key: bool, started: float) -> None:
    if req.json_flag == "-":
        # Standard output carries only the JSON report; everything for people goes to stderr.
        with contextlib.redirect_stdout(sys.stderr):
            run = _run_one(req, insecure_host_key, started)
        write_json(run.report, "-")
    else:
        run = _run_one(req, insecure_host_key, started)
    if run.exit_code:
        raise Exit(code=run.exit_code)


def _run_one(req: _Request, insecure_host_key: bool, started: float) -> pipeline.Run:
    try:
        target = _open_target(req.specs[0] if req.specs else None, req.cfg, insecure_host_key,
                              req.echo)  # fmt: skip
    except KeyboardInterrupt:
        print("provision: interrupted while connecting; nothing was changed", file=sys.stderr)
        raise Exit(code=exitcodes.INTERRUPTED) from None
    out_path = _report_path(req.json_flag, target.name, req.options.dry)
    _check_report_path(req.flag_name, out_path)
    try:
        facts = _gather(target, req)
        print(f"provision {target.name}: {pipeline.describe(facts, req.options.dry)}")
        try:
            run = pipeline.run_steps(
                target,
                facts,
                cfg=req.cfg,
                selected=req.selected,
                options=req.options,
                report_path=out_path,
                log_dir=out_path.parent / "logs",
                work_dir=scratch.controller_cache(),
                started=started,
            )
        except KeyboardInterrupt:
            # Interrupted in a read-only check (a dry run): nothing was applied.
            print("provision: interrupted during the checks; nothing was applied",
                  file=sys.stderr)  # fmt: skip
            raise Exit(code=exitcodes.INTERRUPTED) from None
        except pipeline.Busy as exc:
            raise _bad_input(f"{exc}; nothing was changed") from None
    finally:
        target.close()
    _finish(run, out_path)
    return run


def _gather(target, req: _Request) -> dict[str, Any]:
    """The target's facts; the env file's directory checked before any step changes anything."""
    try:
        facts = facts_mod.gather(target)
        if "envfile" in req.selected and not req.options.dry:
            _check_env_file_writable(target, facts)
    except KeyboardInterrupt:
        print("provision: interrupted before any step ran; nothing was changed",
              file=sys.stderr)  # fmt: skip
        raise Exit(code=exitcodes.INTERRUPTED) from None
    return facts


def _finish(run: pipeline.Run, out_path: Path) -> None:
    """The table, where the report is, how to resume after an interrupt."""
    print(report_mod.table(run.outcomes))
    print(f"actions: {run.report['actions']}  report: {out_path}")
    stopped = plan.interrupted(run.outcomes)
    if stopped is not None:
        done = [o.name for o in run.outcomes if o.action in ("none", "apply")]
        print(
            f"provision: interrupted during step {stopped.name}; finished: "
            f"{', '.join(done) or 'none'}. Re-run the same command to resume (finished steps "
            "check ok and are skipped; a half-done install is detected and redone).",
            file=sys.stderr,
        )


def _open_target(spec, cfg: config_mod.Settings, insecure_host_key: bool, echo: bool):
    """This machine, or one host over SSH; input problems exit 2, unreachable hosts 1."""
    if spec is None:
        return LocalTarget(echo=echo)
    try:
        return SshTarget(
            spec,
            insecure_host_key=insecure_host_key,
            known_hosts=cfg.ssh.known_hosts or None,
            identity=cfg.ssh.identity or None,
            connect_timeout=cfg.ssh.connect_timeout_s,
            echo=echo,
        )
    except TargetInputError as exc:
        raise _bad_input(str(exc)) from exc
    except TargetError as exc:
        raise Exit(message=f"provision: {exc}", code=exitcodes.FAILED) from exc


def register(ns: Collection) -> None:
    """Add `invoke provision` to the root collection."""
    ns.add_task(provision)

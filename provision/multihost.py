"""Provision several hosts at once: one thread per host, each over its own SSH target.

Every host gets the same pipeline as a single `invoke provision --host` (facts, checks, applies,
re-checks, an atomically written JSON report), with its own controller scratch directory and
log directory so parallel runs never share a half-written file. A host that cannot be reached is
reported as `unreachable` and the others carry on; the exit code is the worst of all hosts.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from provision import facts as facts_mod
from provision import pipeline, plan
from provision import report as report_mod
from provision.context import Options
from provision.floor import exitcodes
from provision.settings import Settings
from provision.target import HostSpec, SshTarget, TargetError, parse_host

COMBINED_SCHEMA = "torch-fl/provision-multi/1"
T = TypeVar("T")


@dataclass(frozen=True)
class HostJob:
    """One host to provision and the SSH settings to reach it (None: the config's)."""

    spec: HostSpec
    identity: str | None = None
    known_hosts: str | None = None
    label: str | None = None  # how tables name it (a farm place); default user@host:port

    @property
    def name(self) -> str:
        spec = self.spec
        return self.label or f"{spec.user + '@' if spec.user else ''}{spec.host}:{spec.port}"


@dataclass(frozen=True)
class ProvisionRequest:
    """What every host of one run is given: configuration, steps, options, host-key policy."""

    cfg: Settings
    selected: tuple[str, ...]
    options: Options
    insecure_host_key: bool = False


@dataclass(frozen=True)
class RunPlaces:
    """Where a run of several hosts writes: per-host reports under `out_dir`, per-host scratch
    under `work_root`/hosts, and the combined report (default `out_dir`/combined.json)."""

    out_dir: Path
    work_root: Path
    combined_path: Path | None = None


@dataclass
class HostResult:
    name: str
    status: str  # ok | failed | unreachable | error
    exit_code: int
    report: str
    started: float  # wall clock (time.time())
    finished: float
    facts: dict[str, Any] = field(default_factory=dict)
    outcomes: list[plan.Outcome] = field(default_factory=list)
    actions: int = 0
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "exit_code": self.exit_code,
            "report": self.report,
            "started": round(self.started, 3),
            "finished": round(self.finished, 3),
            "duration_s": round(self.finished - self.started, 3),
            "actions": self.actions,
            "arch": self.facts.get("arch"),
            "pagesize": self.facts.get("pagesize"),
            "error": self.error,
        }


def split_hosts(values: str | Iterable[str] | None) -> list[HostSpec]:
    """`--host a,b --host c` -> specs in order; ValueError on a malformed or repeated host."""
    if values is None:
        return []
    items = [values] if isinstance(values, str) else list(values)
    texts = [t.strip() for item in items for t in str(item).split(",")]
    if any(not t for t in texts):
        raise ValueError(
            "--host has an empty entry; give user@addr[:port] values separated by commas"
        )
    specs = [parse_host(t) for t in texts]
    seen: set[HostSpec] = set()
    files: dict[str, str] = {}
    for text, spec in zip(texts, specs, strict=True):
        if spec in seen:
            raise ValueError(f"--host {text!r} is given twice; list each host once")
        seen.add(spec)
        # Two hosts sharing a report file (and scratch dir) would overwrite each other's.
        name = slug(HostJob(spec).name)
        if name in files:
            raise ValueError(
                f"--host {files[name]!r} and {text!r} would share the same report file "
                f"({name}.json); provision them in separate runs"
            )
        files[name] = text
    return specs


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def run_parallel(
    work: Callable[[int, T], None], items: Sequence[T], name: Callable[[int, T], str]
) -> None:
    """work(index, item) for every item, each in its own daemon thread, until all are done.

    The joins poll, so Ctrl-C reaches the caller as KeyboardInterrupt at once; the threads are
    daemons, so the process can end without waiting for them.
    """
    threads = [
        threading.Thread(target=work, args=(i, item), name=name(i, item), daemon=True)
        for i, item in enumerate(items)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(timeout=0.5)


class HostPrinter:
    """Line-at-a-time output prefixed with the host, so parallel hosts stay readable."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def for_host(self, name: str) -> Callable[[str], None]:
        def echo(msg: str) -> None:
            with self._lock:
                for line in str(msg).splitlines() or [""]:
                    print(f"[{name}] {line}", flush=True)

        return echo


def open_target(job: HostJob, cfg: Settings, insecure_host_key: bool) -> SshTarget:
    """The SSH target for `job`: its own identity and known_hosts where it has them, else the
    configuration's (`ssh:`); named as tables name the job (a farm place keeps its label)."""
    target = SshTarget(
        job.spec,
        insecure_host_key=insecure_host_key,
        known_hosts=job.known_hosts or cfg.ssh.known_hosts or None,
        identity=job.identity or cfg.ssh.identity or None,
        connect_timeout=cfg.ssh.connect_timeout_s,
    )
    target.name = job.name
    return target


def _unreachable_report(job: HostJob, started: float, message: str, cfg: Settings) -> dict:
    doc = report_mod.build(
        target=job.name,
        local=False,
        dry=False,
        started=started,
        facts={},
        outcomes=[],
        artifacts=[],
        exit_code=1,
        config=cfg,
    )
    doc["error"] = message
    return doc


def provision_host(
    job: HostJob,
    request: ProvisionRequest,
    report_path: Path,
    work_dir: Path,
    echo: Callable[[str], None] = print,
) -> HostResult:
    """The single-host pipeline for one job; never raises for a host-side problem."""
    cfg, options = request.cfg, request.options
    started = time.time()
    name = job.name
    try:
        target = open_target(job, cfg, request.insecure_host_key)
    except TargetError as exc:
        echo(f"unreachable: {exc}")
        report_mod.write_atomic(report_path, _unreachable_report(job, started, str(exc), cfg))
        return HostResult(
            name, "unreachable", 1, str(report_path), started, time.time(), error=str(exc)
        )
    try:
        facts = facts_mod.gather(target)
        echo(pipeline.describe(facts, options.dry))
        run = pipeline.run_steps(
            target,
            facts,
            cfg=cfg,
            selected=list(request.selected),
            options=options,
            report_path=report_path,
            log_dir=report_path.parent / "logs" / slug(name),
            work_dir=work_dir,
            started=started,
            echo=echo,
        )
    except Exception as exc:  # noqa: BLE001 - one host's crash (dropped link, bad facts) stays its own
        message = f"{type(exc).__name__}: {exc}"
        echo(f"error: {message}")
        doc = _unreachable_report(job, started, message, cfg)
        report_mod.write_atomic(report_path, doc)
        return HostResult(name, "error", 1, str(report_path), started, time.time(), error=message)
    finally:
        target.close()
    status = "ok" if run.exit_code == 0 else "failed"
    return HostResult(
        name,
        status,
        run.exit_code,
        str(report_path),
        started,
        time.time(),
        facts=facts,
        outcomes=run.outcomes,
        actions=run.report["actions"],
    )


def provision_hosts(
    jobs: list[HostJob], request: ProvisionRequest, places: RunPlaces
) -> tuple[int, list[HostResult], Path]:
    """Provision every job in its own thread; write per-host reports and a combined one.

    Returns (worst exit code, results in job order, combined report path).
    """
    names = [job.name for job in jobs]
    if len(set(names)) != len(names):
        raise ValueError(f"two hosts share a name: {names}")
    dry = request.options.dry
    printer = HostPrinter()
    results: dict[int, HostResult] = {}
    started = time.time()

    def work(index: int, job: HostJob) -> None:
        name = job.name
        echo = printer.for_host(name)
        try:
            results[index] = provision_host(
                job,
                request,
                # a dry run writes beside the real report, never over it (as for one host)
                report_path=places.out_dir / f"{slug(name)}{'.dry' if dry else ''}.json",
                # Steps cache downloads and build the probe under work_dir with fixed names;
                # a directory per host keeps parallel hosts off each other's temp files.
                work_dir=places.work_root / "hosts" / slug(name),
                echo=echo,
            )
        except BaseException as exc:  # noqa: BLE001 - report, never lose a host silently
            now = time.time()
            results[index] = HostResult(
                name, "error", 1, "", now, now, error=f"{type(exc).__name__}: {exc}"
            )

    # Ctrl-C ends the command; every report already written is complete (atomic writes) and
    # each step is idempotent, so the next run resumes.
    try:
        run_parallel(work, jobs, lambda i, job: f"provision-{job.name}")
    except KeyboardInterrupt:
        done = [r.report for r in results.values() if r.report]
        print(f"provision: interrupted; complete reports so far: {done or 'none'}", flush=True)
        raise
    ordered = [results[i] for i in range(len(jobs))]
    code = max((r.exit_code for r in ordered), default=0)
    combined = places.combined_path or places.out_dir / "combined.json"
    if dry:
        combined = combined.with_name(f"{combined.stem}.dry{combined.suffix or '.json'}")
    doc = {
        "schema": COMBINED_SCHEMA,
        "dry": dry,
        "started": round(started, 3),
        "duration_s": round(time.time() - started, 3),
        "exit_code": code,
        "hosts": [r.to_json() for r in ordered],
    }
    report_mod.write_atomic(combined, doc)
    return code, ordered, combined


def table(results: list[HostResult]) -> str:
    """One row per host and step; an unreachable or crashed host gets one row saying so."""
    rows = [("host", "step", "before", "action", "after", "duration", "detail")]
    for res in results:
        if not res.outcomes:
            rows.append(
                (res.name, "-", "-", "-", res.status, f"{res.finished - res.started:.1f}s",
                 " ".join((res.error or "").split()))
            )  # fmt: skip
            continue
        for o in res.outcomes:
            detail = o.error or (o.final.detail if o.final else "")
            rows.append(
                (
                    res.name,
                    o.name,
                    o.before.status if o.before else "-",
                    o.action,
                    o.after.status if o.after else "-",
                    f"{o.duration_s:.1f}s",
                    " ".join(detail.split()),
                )
            )
    return report_mod.wrapped_table(rows)


def summary_lines(results: list[HostResult], combined: Path) -> list[str]:
    lines = [
        f"{r.name}: {r.status} (exit {r.exit_code}, {r.actions} actions, "
        f"{r.finished - r.started:.1f}s) report: {r.report}"
        for r in results
    ]
    lines.append(f"combined report: {combined}")
    return lines


def run_cli(specs: list[HostSpec], request: ProvisionRequest, places: RunPlaces) -> int:
    """`invoke provision --host a,b,...`: provision all, print the table, return the worst code."""
    jobs = [HostJob(spec) for spec in specs]
    print(f"provision: {len(jobs)} hosts in parallel: {', '.join(j.name for j in jobs)}")
    try:
        code, results, combined = provision_hosts(jobs, request, places)
    except KeyboardInterrupt:
        return exitcodes.INTERRUPTED  # as for a single host
    print(table(results))
    print("\n".join(summary_lines(results, combined)))
    return code

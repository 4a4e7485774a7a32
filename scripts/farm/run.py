"""Hold places and work on them in parallel: reserve, acquire, resolve, provision, run lanes,
fetch, then release and cancel whatever happened (also on Ctrl-C)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provision import facts as facts_mod
from provision.multihost import HostJob, HostPrinter, provision_host, run_parallel, slug
from provision.steps import Options
from provision.target import HostSpec, SshTarget, TargetError
from scripts.farm import power
from scripts.farm.board import Board, BoardError
from scripts.farm.labgrid_client import FarmError, LabgridClient
from scripts.farm.report import (
    PlaceOutcome,
    format_table,
    lane_rows,
    provision_rows,
    tag_contradictions,
    write,
)
from scripts.farm.selection import Request
from scripts.farm.settings import FarmSettings


@dataclass
class FarmJob:
    """Everything a farm run needs, fixed before the first place is reserved."""

    settings: FarmSettings
    requests: list[Request]
    out_dir: Path
    root: Path
    work_root: Path
    provision_cfg: dict[str, Any]
    selected_steps: list[str]
    options: Options = field(default_factory=Options)
    provision: bool = True
    lanes: list[str] = field(default_factory=list)  # empty: provision only
    matrix_file: str = "matrix.yaml"
    setup: str = "bootstrap"
    board_python: str | None = None
    insecure_host_key: bool = False
    reserve_timeout_s: float = 300.0
    lane_timeout_s: float = 3600.0
    boot_timeout_s: float = 300.0  # after a power cycle
    client_env: dict[str, str] = field(default_factory=dict)


class _Holdings:
    """Tokens and places currently held, so an interrupted run still gives them back."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: dict[str, str | None] = {}  # token -> place (None until acquired)

    def set(self, token: str, place: str | None) -> None:
        with self.lock:
            self.items[token] = place

    def drop(self, token: str) -> None:
        with self.lock:
            self.items.pop(token, None)

    def snapshot(self) -> dict[str, str | None]:
        with self.lock:
            return dict(self.items)


def _give_back(client: LabgridClient, token: str, place: str | None) -> list[str]:
    errors = []
    if place:
        try:
            client.release(place)
        except FarmError as exc:
            errors.append(f"release of {place} failed: {exc}")
    try:
        client.cancel(token)
    except FarmError as exc:
        if "does not exist" not in str(exc):  # already expired or consumed: nothing to give back
            errors.append(f"cancelling reservation {token} failed: {exc}")
    return errors


def _ssh_target(job: FarmJob, host: HostJob) -> SshTarget:
    cfg = job.provision_cfg
    target = SshTarget(
        host.spec,
        insecure_host_key=job.insecure_host_key,
        known_hosts=host.known_hosts or cfg["ssh"]["known_hosts"] or None,
        identity=host.identity or cfg["ssh"]["identity"] or None,
        connect_timeout=float(cfg["ssh"]["connect_timeout_s"]),
    )
    target.name = host.name
    return target


def _work_on_place(
    job: FarmJob,
    outcome: PlaceOutcome,
    client: LabgridClient,
    place: str,
    echo: Callable[[str], None],
) -> None:
    info = client.resolve(place)
    outcome.tags, outcome.power, outcome.serial = info["tags"], info["power"], info["serial"]
    net = info["network"]
    if net is None:
        outcome.infra(f"place {place} has no NetworkService resource (add one to its exporter)")
        return
    if not net["avail"]:
        outcome.infra(f"place {place}: its NetworkService is unavailable (exporter down?)")
        return
    outcome.network = net
    if not power.answers(net["address"], int(net["port"])) and info["power"]:
        outcome.power_cycled = True
        if not power.recover(
            client, place, net["address"], int(net["port"]), job.boot_timeout_s, echo
        ):
            outcome.infra(
                f"place {place} did not answer on SSH, not even {job.boot_timeout_s:.0f}s "
                "after a power cycle"
            )
            return
    echo(
        f"held; ssh {net['username']}@{net['address']}:{net['port']}"
        f"{'; power control' if info['power'] else ''}{'; serial console' if info['serial'] else ''}"
    )
    ssh = job.settings.ssh_for(place)
    host = HostJob(
        HostSpec(net["username"] or None, net["address"], int(net["port"])),
        identity=ssh.get("identity"),
        known_hosts=ssh.get("known_hosts"),
        label=place,
    )
    place_dir = job.out_dir / slug(place)
    if job.provision:
        res = provision_host(
            host,
            cfg=job.provision_cfg,
            selected=job.selected_steps,
            options=job.options,
            insecure_host_key=job.insecure_host_key,
            report_path=place_dir / "provision.json",
            work_dir=job.work_root / "hosts" / slug(place),
            echo=echo,
        )
        outcome.provision = res.to_json()
        outcome.facts = res.facts
        if res.status in ("unreachable", "error"):
            outcome.infra(f"{res.status}: {res.error}")
            return
    else:
        target = _ssh_target(job, host)
        try:
            outcome.facts = facts_mod.gather(target)
        finally:
            target.close()
    for problem in tag_contradictions(outcome.tags, outcome.facts):
        outcome.infra(problem)
    if outcome.errors or not job.lanes:
        return
    if outcome.provision and outcome.provision["status"] != "ok":
        outcome.infra("provisioning failed; lanes not run (see its report)")
        return
    target = _ssh_target(job, host)
    try:
        board = Board(target, place_dir / "board.log", echo)
        board.ship_checkout(job.root)
        python, env = board.setup(job.setup, job.board_python)
        board.run_lanes(python, env, job.lanes, job.matrix_file, job.lane_timeout_s)
        got = board.fetch(place_dir)
    finally:
        target.close()
    outcome.junit = [str(p) for p in got["junit"]]
    outcome.logs = [str(p) for p in got["logs"]]
    if got["summary"] is None:
        outcome.infra("the board produced no summary.json (see board.log)")
        return
    outcome.summary = json.loads(Path(got["summary"]).read_text(encoding="utf-8"))
    for problem in tag_contradictions(outcome.tags, outcome.summary.get("capabilities") or {}):
        outcome.infra(f"lanes: {problem}")


def _run_request(
    job: FarmJob, request: Request, holdings: _Holdings, echo: Callable[[str], None]
) -> PlaceOutcome:
    outcome = PlaceOutcome(label=request.label, started=time.time())
    client = LabgridClient(job.settings.coordinator, env=job.client_env)
    token: str | None = None
    place: str | None = None
    try:
        token = client.reserve(request.filters)
        outcome.token = token
        holdings.set(token, None)
        client.wait(token, job.reserve_timeout_s)
        # Acquire at once: an allocated reservation expires if nobody acquires it.
        place = client.acquire(token)
        outcome.place = place
        holdings.set(token, place)
        _work_on_place(job, outcome, client, place, echo)
        # Results from a place whose exporter went away cannot be trusted: the board may have
        # been powered off or handed to someone else under us.
        if outcome.network is not None:
            after = client.resolve(place)
            if after["network"] is None or not after["network"]["avail"]:
                outcome.infra(f"the exporter of place {place} went away during the run")
    except (FarmError, BoardError, TargetError, OSError) as exc:
        outcome.infra(str(exc))
    except Exception as exc:  # noqa: BLE001 - a place's crash is that place's infra-error
        outcome.infra(f"{type(exc).__name__}: {exc}")
    finally:
        if token is not None:
            for problem in _give_back(client, token, place):
                outcome.infra(problem)
            holdings.drop(token)
            outcome.released = True
        outcome.finished = time.time()
        echo(f"done: {'ok' if not outcome.errors else '; '.join(outcome.errors)}")
    return outcome


def run(job: FarmJob) -> tuple[int, list[PlaceOutcome], Path]:
    """Work on every requested place in parallel; write and print the merged report."""
    printer = HostPrinter()
    holdings = _Holdings()
    results: dict[int, PlaceOutcome] = {}
    started = time.time()

    def work(index: int, request: Request) -> None:
        results[index] = _run_request(job, request, holdings, printer.for_host(request.label))

    try:
        run_parallel(work, job.requests, lambda i, r: f"farm-{i}")
    except KeyboardInterrupt:
        client = LabgridClient(job.settings.coordinator, env=job.client_env)
        for token, place in holdings.snapshot().items():
            problems = _give_back(client, token, place)
            print(
                f"interrupted: gave back {place or token}{': ' + '; '.join(problems) if problems else ''}"
            )
        raise
    outcomes = [results[i] for i in range(len(job.requests))]
    rows = []
    for outcome in outcomes:
        rows += lane_rows(outcome, job.lanes) if job.lanes else provision_rows(outcome)
    meta = {
        "coordinator": job.settings.coordinator,
        "mode": "test" if job.lanes else "provision",
        "lanes": job.lanes,
        "started": round(started, 3),
    }
    code, json_path, junit_path = write(outcomes, rows, job.out_dir, meta)
    print(format_table(rows))
    print(f"farm report: {json_path}  junit: {junit_path}")
    return code, outcomes, json_path

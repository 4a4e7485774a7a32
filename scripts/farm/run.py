"""Hold places and work on them in parallel: reserve, acquire, work on the place (place_flow.py:
resolve, provision, run lanes, fetch), then release and cancel whatever happened (also on Ctrl-C)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from provision.multihost import HostPrinter, run_parallel
from provision.target import TargetError
from scripts.farm import place_flow
from scripts.farm.board import BoardError
from scripts.farm.job import FarmJob
from scripts.farm.labgrid_client import FarmError, LabgridClient
from scripts.farm.report import PlaceOutcome, format_table, lane_rows, provision_rows, write
from scripts.farm.selection import Request

__all__ = ["FarmJob", "run"]


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
        place_flow.drive(place_flow.PlaceContext(job, outcome, client, place, echo))
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

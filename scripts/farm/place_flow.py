"""What the farm does with one held place, as explicit states (labgrid-strategy style).

    resolve -> network -> power -> provision -> ship -> setup -> lanes -> fetch

Each state is a small function of the place's `PlaceContext`: it returns the name of the next
state, or a `Stop` (the end: no reasons when the place's work is done, else the infra-errors it
ends on, recorded on the outcome as they were written). `drive` runs them in `STATES` order from
the first; an exception from a state goes to the caller (run.py records it as the place's
infra-error) after the board connection is closed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from provision import cache_ship
from provision import facts as facts_mod
from provision.multihost import HostJob, ProvisionRequest, open_target, provision_host, slug
from provision.target import HostSpec, SshTarget
from scripts.farm import power
from scripts.farm.board import LIBRARY_DIRS, Board, BoardEnv
from scripts.farm.job import FarmJob
from scripts.farm.labgrid_client import LabgridClient
from scripts.farm.report import PlaceOutcome, tag_contradictions


@dataclass(frozen=True)
class Stop:
    """The end of a place's flow: `reasons` empty when done, else its infra-errors."""

    reasons: tuple[str, ...] = ()
    state: str = ""  # filled in by drive(): the state that stopped

    @property
    def ok(self) -> bool:
        return not self.reasons


def fail(*reasons: str) -> Stop:
    return Stop(tuple(reasons))


DONE = Stop()


@dataclass
class PlaceContext:
    """One held place: the job, its outcome (filled in as states run) and what states hand on."""

    job: FarmJob
    outcome: PlaceOutcome
    client: LabgridClient
    place: str
    echo: Callable[[str], None]
    info: dict[str, Any] = field(default_factory=dict)  # client.resolve(place)
    host: HostJob | None = None
    target: SshTarget | None = None  # the board connection from ship to fetch
    board: Board | None = None
    board_env: BoardEnv | None = None  # what provisioning made there, for bootstrap to complete
    python: str = ""
    env: dict[str, str] = field(default_factory=dict)
    trail: list[str] = field(default_factory=list)  # the states run, in order

    @property
    def place_dir(self) -> Path:
        return self.job.out_dir / slug(self.place)

    @property
    def net(self) -> dict[str, Any]:
        return self.outcome.network or {}

    def close(self) -> None:
        target, self.target, self.board = self.target, None, None
        if target is not None:
            target.close()


def ssh_target(job: FarmJob, host: HostJob) -> SshTarget:
    return open_target(host, job.provision_cfg, job.insecure_host_key)


def resolve(ctx: PlaceContext) -> str | Stop:
    """What the place offers: tags, network, power control, serial console."""
    ctx.info = info = ctx.client.resolve(ctx.place)
    ctx.outcome.tags, ctx.outcome.power, ctx.outcome.serial = (
        info["tags"], info["power"], info["serial"]
    )  # fmt: skip
    return "network"


def network(ctx: PlaceContext) -> str | Stop:
    """The place's NetworkService: present and available."""
    net = ctx.info["network"]
    if net is None:
        return fail(f"place {ctx.place} has no NetworkService resource (add one to its exporter)")
    if not net["avail"]:
        return fail(f"place {ctx.place}: its NetworkService is unavailable (exporter down?)")
    ctx.outcome.network = net
    return "power"


def power_state(ctx: PlaceContext) -> str | Stop:
    """A board that does not answer on SSH is power cycled (where the place can) and waited for."""
    job, net, info = ctx.job, ctx.net, ctx.info
    if not power.answers(net["address"], int(net["port"])) and info["power"]:
        ctx.outcome.power_cycled = True
        if not power.recover(
            ctx.client, ctx.place, net["address"], int(net["port"]), job.boot_timeout_s, ctx.echo
        ):
            return fail(
                f"place {ctx.place} did not answer on SSH, not even {job.boot_timeout_s:.0f}s "
                "after a power cycle"
            )
    ctx.echo(
        f"held; ssh {net['username']}@{net['address']}:{net['port']}"
        f"{'; power control' if info['power'] else ''}{'; serial console' if info['serial'] else ''}"
    )
    ssh = job.settings.ssh_for(ctx.place)
    ctx.host = HostJob(
        HostSpec(net["username"] or None, net["address"], int(net["port"])),
        identity=ssh.get("identity"),
        known_hosts=ssh.get("known_hosts"),
        label=ctx.place,
    )
    return "provision"


def provision(ctx: PlaceContext) -> str | Stop:
    """Provision the board (or only detect its facts) and check its tags against them."""
    job, outcome = ctx.job, ctx.outcome
    if job.provision:
        request = ProvisionRequest(
            job.provision_cfg, tuple(job.selected_steps), job.options, job.insecure_host_key
        )
        res = provision_host(
            ctx.host,
            request,
            report_path=ctx.place_dir / "provision.json",
            work_dir=job.work_root / "hosts" / slug(ctx.place),
            echo=ctx.echo,
        )
        outcome.provision = res.to_json()
        outcome.facts = res.facts
        if res.status in ("unreachable", "error"):
            return fail(f"{res.status}: {res.error}")
    else:
        target = ssh_target(job, ctx.host)
        try:
            outcome.facts = facts_mod.gather(target)
        finally:
            target.close()
    problems = tag_contradictions(outcome.tags, outcome.facts)
    if problems:
        return fail(*problems)
    if not job.lanes:
        return DONE
    if outcome.provision and outcome.provision["status"] != "ok":
        return fail("provisioning failed; lanes not run (see its report)")
    return "ship"


def provision_steps(outcome: PlaceOutcome) -> dict[str, tuple[dict[str, Any], Any]]:
    """{step: (its last check: after its apply, or the first when nothing was needed; its
    duration)} from this run's provisioning report ({} without one)."""
    path = (outcome.provision or {}).get("report")
    if not path or not Path(path).is_file():
        return {}
    steps = json.loads(Path(path).read_text()).get("steps", [])
    return {
        s.get("name"): (s.get("after") or s.get("before") or {}, s.get("duration_s")) for s in steps
    }


def provisioned_env(outcome: PlaceOutcome, offline: bool) -> BoardEnv | None:
    """The board's torch-fl environment when this run's provisioning made or checked it (its
    torch_env and torch_fl steps ended ok), else None."""
    steps = provision_steps(outcome)
    env, lib = (steps.get(name, ({}, None))[0] for name in ("torch_env", "torch_fl"))
    root = (env.get("facts") or {}).get("root")
    if env.get("status") != "ok" or lib.get("status") != "ok" or not root:
        return None
    return BoardEnv(f"{root}/venv", f"{root}/wheels" if offline else "")


def ship(ctx: PlaceContext) -> str | Stop:
    """Connect (the connection stays open until fetch) and copy the checkout to the board."""
    ctx.target = ssh_target(ctx.job, ctx.host)
    ctx.board = Board(ctx.target, ctx.place_dir / "board.log", ctx.echo)
    if ctx.job.setup == "bootstrap":
        ctx.board_env = provisioned_env(ctx.outcome, ctx.job.options.artifacts is not None)
    # The lanes test the library the board installed, not a copy of its sources beside it.
    ctx.board.ship_checkout(ctx.job.root, LIBRARY_DIRS if ctx.board_env else ())
    if ctx.job.ship_cache is not None:
        # Compiled partitions hit on the board under the same keys: no compiler needed there.
        bundle = cache_ship.write_bundle(ctx.job.ship_cache, ctx.place_dir / "bpu-cache.tar.gz")
        cache_ship.ship_bundle(ctx.target, bundle)
        ctx.echo(f"BPU cache {ctx.job.ship_cache} -> {cache_ship.BOARD_CACHE}")
    return "setup"


def setup(ctx: PlaceContext) -> str | Stop:
    """The board's Python environment for the lanes (bootstrap or kit)."""
    ctx.python, ctx.env = ctx.board.setup(ctx.job.setup, ctx.job.board_python, ctx.board_env)
    return "lanes"


def lanes(ctx: PlaceContext) -> str | Stop:
    job = ctx.job
    ctx.board.run_lanes(ctx.python, ctx.env, job.lanes, job.matrix_file, job.lane_timeout_s)
    return "fetch"


def fetch(ctx: PlaceContext) -> str | Stop:
    """Bring back junit, logs and summary.json; the summary's capabilities must match the tags."""
    try:
        got = ctx.board.fetch(ctx.place_dir)
    finally:
        ctx.close()
    outcome = ctx.outcome
    outcome.junit = [str(p) for p in got["junit"]]
    outcome.logs = [str(p) for p in got["logs"]]
    outcome.results = [str(p) for p in got["results"]]
    if got["summary"] is None:
        return fail("the board produced no summary.json (see board.log)")
    outcome.summary = json.loads(Path(got["summary"]).read_text(encoding="utf-8"))
    problems = tag_contradictions(outcome.tags, outcome.summary.get("capabilities") or {})
    return fail(*(f"lanes: {p}" for p in problems)) if problems else DONE


State = Callable[[PlaceContext], "str | Stop"]

# The flow, in order: drive() starts at the first.
STATES: tuple[tuple[str, State], ...] = (
    ("resolve", resolve),
    ("network", network),
    ("power", power_state),
    ("provision", provision),
    ("ship", ship),
    ("setup", setup),
    ("lanes", lanes),
    ("fetch", fetch),
)


def drive(ctx: PlaceContext, states: tuple[tuple[str, State], ...] = STATES) -> Stop:
    """Run `states` from the first until one stops; its reasons become the outcome's errors."""
    table = dict(states)
    state = states[0][0]
    try:
        while True:
            ctx.trail.append(state)
            result = table[state](ctx)
            if isinstance(result, Stop):
                for reason in result.reasons:
                    ctx.outcome.infra(reason)
                return replace(result, state=state)
            if result not in table:
                raise ValueError(f"farm state {state!r} went to unknown state {result!r}")
            state = result
    finally:
        ctx.close()

"""The per-place state machine (scripts/farm/place_flow.py) with stand-ins for labgrid, SSH,
provisioning and the board: the states run in their documented order, and a state that stops
the place skips every later one and leaves its own reason (as the farm report shows it)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from provision import config
from scripts.farm import place_flow
from scripts.farm.board import LIBRARY_DIRS, BoardEnv
from scripts.farm.job import FarmJob
from scripts.farm.report import PlaceOutcome, tag_contradictions

ORDER = ["resolve", "network", "power", "provision", "ship", "setup", "lanes", "fetch"]
NET = {"address": "127.0.0.1", "port": 2222, "username": "u", "avail": True}


class Client:
    def __init__(self, info: dict) -> None:
        self.info = info

    def resolve(self, place: str) -> dict:
        return self.info


class Board:
    """Records what the flow asks of the board; `fetch` hands back `summary` (None: none)."""

    def __init__(self, calls: list, summary: Path | None, fail_in: str = "") -> None:
        self.calls, self.summary, self.fail_in = calls, summary, fail_in

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail_in:
            raise OSError(f"{name} broke")

    def ship_checkout(self, root, without=()):
        self._call("ship_checkout")
        self.without = without

    def setup(self, mode, board_python, board_env=None):
        self._call("setup")
        self.board_env = board_env
        return "python3", {}

    def run_lanes(self, python, env, lanes, matrix_file, timeout):
        self._call("run_lanes")

    def fetch(self, dest):
        self._call("fetch")
        return {"junit": [dest / "unit.xml"], "logs": [], "summary": self.summary, "results": []}


@pytest.fixture
def flow(tmp_path, monkeypatch):
    """make(...) -> (context, calls): the real states, with everything outside stood in for."""
    calls: list[str] = []

    def make(*, network=NET, power=False, answers=True, recovers=False, status="ok",
             facts=None, tags=None, lanes=("unit",), provision=True, summary="ok",
             fail_in="", report=None):  # fmt: skip
        info = {"tags": tags or {}, "power": power, "serial": False, "network": network}
        monkeypatch.setattr(place_flow.power, "answers", lambda a, p: answers)
        monkeypatch.setattr(
            place_flow.power, "recover", lambda *a: calls.append("recover") or recovers
        )
        result = SimpleNamespace(status=status, error="no route", facts=facts or {},
                                 to_json=lambda: {"status": status, "report": report})  # fmt: skip
        monkeypatch.setattr(
            place_flow, "provision_host", lambda *a, **k: calls.append("provision") or result
        )
        monkeypatch.setattr(place_flow.facts_mod, "gather", lambda t: facts or {})
        target = SimpleNamespace(close=lambda: calls.append("close"))
        monkeypatch.setattr(place_flow, "ssh_target", lambda job, host: target)
        summary_path = None
        if summary is not None:
            summary_path = tmp_path / "summary.json"
            summary_path.write_text(json.dumps({"capabilities": facts or {}, "lanes": []}))
        board = Board(calls, summary_path, fail_in)
        monkeypatch.setattr(place_flow, "Board", lambda *a: board)
        job = FarmJob(
            settings=SimpleNamespace(ssh_for=lambda place: {}), requests=[],
            out_dir=tmp_path / "out", root=tmp_path, work_root=tmp_path / "work",
            provision_cfg=config.load(), selected_steps=[], provision=provision, lanes=list(lanes),
        )  # fmt: skip
        ctx = place_flow.PlaceContext(job, PlaceOutcome("b0"), Client(info), "b0", lambda m: None)
        ctx.fake_board = board
        return ctx, calls

    return make


def test_the_states_are_the_documented_ones_in_order():
    assert [name for name, _ in place_flow.STATES] == ORDER


def test_a_place_that_works_runs_every_state_in_order(flow):
    ctx, calls = flow()
    stop = place_flow.drive(ctx)
    assert stop.ok and stop.state == "fetch"
    assert ctx.trail == ORDER
    assert calls == ["provision", "ship_checkout", "setup", "run_lanes", "fetch", "close"]
    assert ctx.outcome.errors == []
    assert ctx.outcome.network == NET and ctx.outcome.junit
    assert ctx.outcome.summary == {"capabilities": {}, "lanes": []}


def test_provision_only_ends_after_provisioning(flow):
    ctx, calls = flow(lanes=())
    stop = place_flow.drive(ctx)
    assert stop.ok and stop.state == "provision"
    assert ctx.trail == ORDER[:4] and calls == ["provision"]


NO_SSH = "place b0 did not answer on SSH, not even 300s after a power cycle"


@pytest.mark.parametrize(
    "kwargs, state, reason",
    [
        ({"network": None},
         "network", "place b0 has no NetworkService resource (add one to its exporter)"),
        ({"network": {**NET, "avail": False}},
         "network", "place b0: its NetworkService is unavailable (exporter down?)"),
        ({"answers": False, "power": True, "recovers": False}, "power", NO_SSH),
        ({"status": "unreachable"}, "provision", "unreachable: no route"),
        ({"status": "error"}, "provision", "error: no route"),
        ({"status": "failed"}, "provision", "provisioning failed; lanes not run (see its report)"),
        ({"summary": None}, "fetch", "the board produced no summary.json (see board.log)"),
    ],
    ids=["no-network", "network-down", "dead-after-power-cycle", "host-unreachable",
         "provision-error", "provision-failed", "no-summary"],
)  # fmt: skip
def test_a_stop_skips_the_later_states_and_names_its_reason(flow, kwargs, state, reason):
    ctx, calls = flow(**kwargs)
    stop = place_flow.drive(ctx)
    assert (stop.state, stop.reasons) == (state, (reason,))
    assert ctx.outcome.errors == [reason]
    assert ctx.trail == ORDER[: ORDER.index(state) + 1]
    if ORDER.index(state) < ORDER.index("ship"):
        assert not {"ship_checkout", "setup", "run_lanes", "fetch"} & set(calls), calls


def test_a_board_that_answers_is_not_power_cycled(flow):
    ctx, calls = flow(answers=True, power=True)
    place_flow.drive(ctx)
    assert "recover" not in calls and not ctx.outcome.power_cycled


def test_a_power_cycle_that_revives_the_board_goes_on(flow):
    ctx, calls = flow(answers=False, power=True, recovers=True)
    stop = place_flow.drive(ctx)
    assert stop.ok and ctx.trail == ORDER
    assert calls[0] == "recover" and ctx.outcome.power_cycled


def test_tags_the_facts_contradict_stop_at_provision_with_every_contradiction(flow):
    tags, facts = {"arch": "aarch64", "pagesize": "65536"}, {"arch": "x86_64", "pagesize": 4096}
    ctx, calls = flow(tags=tags, facts=facts)
    stop = place_flow.drive(ctx)
    expected = tag_contradictions(tags, facts)
    assert len(expected) == 2
    assert stop.state == "provision" and ctx.outcome.errors == expected
    assert calls == ["provision"]


def test_a_state_that_raises_skips_the_rest_and_closes_the_board_connection(flow):
    ctx, calls = flow(fail_in="setup")
    with pytest.raises(OSError, match="setup broke"):
        place_flow.drive(ctx)
    assert ctx.trail == ORDER[: ORDER.index("setup") + 1]
    assert calls == ["provision", "ship_checkout", "setup", "close"]
    assert ctx.target is None


def test_drive_follows_the_table_and_refuses_an_unknown_state():
    ran: list[str] = []

    def step(name: str, then):
        return name, lambda ctx: ran.append(name) or then

    ctx = SimpleNamespace(trail=[], outcome=PlaceOutcome("x"), close=lambda: ran.append("close"))
    table = (step("a", "b"), step("b", place_flow.fail("b says no")), step("c", place_flow.DONE))
    stop = place_flow.drive(ctx, table)
    assert (stop.state, stop.reasons, ran) == ("b", ("b says no",), ["a", "b", "close"])
    assert ctx.outcome.errors == ["b says no"]
    with pytest.raises(ValueError, match="unknown state 'nowhere'"):
        place_flow.drive(ctx, (step("a", "nowhere"),))


def test_ship_cache_puts_the_bpu_cache_on_the_board_before_its_lanes(flow, tmp_path, monkeypatch):
    """`farm.test --ship-cache`: the bundle goes through the place's target (here this machine,
    a real shell) and lands whole in the board's default cache before setup and the lanes."""
    from provision.target import LocalTarget

    ctx, calls = flow(provision=False)
    cache = tmp_path / "cache"
    entry = cache / "artifacts" / ("a" * 64)
    entry.mkdir(parents=True)
    (entry / "model.hbm").write_bytes(b"hbm")
    (entry / "manifest.json").write_text("{}")
    board_home = tmp_path / "board-home"
    board_home.mkdir()
    real = LocalTarget(env={"HOME": str(board_home)})

    class Recording:
        name = "b0"

        def put(self, local, remote):
            calls.append("put")
            real.put(local, remote)

        def run(self, cmd, timeout=120.0, env=None):
            calls.append("run")
            return real.run(cmd, timeout=timeout)

        def close(self):
            calls.append("close")

    monkeypatch.setattr(place_flow, "ssh_target", lambda job, host: Recording())
    ctx.job.ship_cache = cache
    assert place_flow.drive(ctx).ok
    # (--no-provision: the facts are read over a connection of their own first)
    after = calls[calls.index("ship_checkout") :]
    assert after == ["ship_checkout", "put", "run", "setup", "run_lanes", "fetch", "close"]
    shipped = board_home / ".cache" / "torch-fl" / "bpu" / "artifacts" / ("a" * 64)
    assert sorted(p.name for p in shipped.iterdir()) == ["manifest.json", "model.hbm"]


def test_a_board_provisioned_with_torch_fl_tests_the_installed_library(flow, tmp_path):
    """Provisioning made the board's environment: bootstrap completes it and the checkout goes
    without the library's sources; otherwise the whole checkout and a bootstrap of its own."""
    report = tmp_path / "provision.json"
    steps = [{"name": n, "before": {"status": "ok", "facts": {"root": "/p/torch-env"}}}
             for n in ("torch_env", "torch_fl")]  # fmt: skip
    report.write_text(json.dumps({"steps": steps}))
    ctx, calls = flow(report=str(report))
    assert place_flow.drive(ctx).ok
    assert ctx.fake_board.without == LIBRARY_DIRS
    assert ctx.fake_board.board_env == BoardEnv("/p/torch-env/venv", "")  # no --artifacts
    plain, _ = flow()
    assert place_flow.drive(plain).ok
    assert plain.fake_board.without == () and plain.fake_board.board_env is None

"""box64 detection and the page-size probe against stand-in box64 executables.

The machine is x86_64, so the facts are those of an aarch64 board (recorded, with the page size
chosen per case) while every command runs for real: the stand-ins execute the real x86_64 probe
natively, which is what a working box64 does on a board.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from provision import config as config_mod
from provision import facts as facts_mod
from provision import plan
from provision.context import Context, Options
from provision.results import FAILED, NEEDED, OK, Inputs
from provision.steps import all_steps
from provision.steps.box64 import STEP as BOX64
from provision.steps.pagesize_probe import STEP as PROBE
from provision.target import LocalTarget

STANDINS = Path(__file__).resolve().parents[1] / "standins" / "box64"


def board_ctx(tmp_path: Path, standin: str, pagesize: int = 4096, **cfg_over) -> Context:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path / "home"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    target = LocalTarget(env)
    facts = facts_mod.gather(target)
    facts.update(arch="aarch64", pagesize=pagesize, apt="", board_model="")
    over = {"box64": {"path": str(STANDINS / standin), "allow_distro": False}}
    cfg = config_mod.parse(config_mod.deep_merge(config_mod.defaults(), {**over, **cfg_over}))
    return Context(
        target=target,
        facts=facts,
        config=cfg,
        options=Options(),
        log_dir=tmp_path / "logs",
        work_dir=tmp_path / "work",
        echo=lambda msg: None,
    )


def test_new_enough_passes_version_and_probe(tmp_path):
    ctx = board_ctx(tmp_path, "box64-standin-new")
    res = BOX64.check(ctx, Inputs())
    assert res.status == OK and res.facts["version"] == "0.4.5"
    probe = PROBE.check(ctx, plan.inputs_for(ctx, PROBE))
    assert probe.status == OK, probe.detail
    assert probe.facts["guest_pagesize"] == 4096


def test_too_old_is_needed_and_goes_to_source_build(tmp_path):
    ctx = board_ctx(tmp_path, "box64-standin-old")
    res = BOX64.check(ctx, Inputs())
    assert res.status == NEEDED
    assert "0.2.6" in res.detail and "0.4.0" in res.detail
    decision = BOX64.decide(ctx, res)
    assert decision.kind == "source"


def test_policy_is_configurable(tmp_path):
    ctx = board_ctx(tmp_path, "box64-standin-old", policy={"min_box64": "0.2.0"})
    assert BOX64.check(ctx, Inputs()).status == OK


def test_large_page_abort_is_named_with_fix(tmp_path):
    ctx = board_ctx(tmp_path, "box64-standin-abort", pagesize=65536, policy={"min_box64": "0.2.0"})
    assert BOX64.check(ctx, Inputs()).status == OK  # the version string alone looks fine...
    probe = PROBE.check(ctx, plan.inputs_for(ctx, PROBE))  # ...the probe is what catches it
    assert probe.status == FAILED
    assert "PageSize configuration is wrong" in probe.detail
    assert "0.4.0" in probe.detail and "65536" in probe.detail


def test_exit_zero_without_running_is_caught(tmp_path):
    ctx = board_ctx(tmp_path, "box64-standin-exit0")
    assert BOX64.check(ctx, Inputs()).status == OK
    probe = PROBE.check(ctx, plan.inputs_for(ctx, PROBE))
    assert probe.status == FAILED and "never ran" in probe.detail


def test_page_size_mismatch_is_caught(tmp_path):
    # the stand-in runs the probe natively on this 4K kernel; the recorded board has 64K pages
    ctx = board_ctx(tmp_path, "box64-standin-new", pagesize=65536)
    probe = PROBE.check(ctx, plan.inputs_for(ctx, PROBE))
    assert probe.status == FAILED and "sees page size 4096" in probe.detail


def test_missing_explicit_box64_fails_with_fix(tmp_path):
    ctx = board_ctx(tmp_path, "box64-standin-does-not-exist")
    res = BOX64.check(ctx, Inputs())
    assert res.status == FAILED and "box64.path" in res.detail


@pytest.mark.skipif(not shutil.which("python3"), reason="needs an x86_64 python3")
def test_board_pipeline_with_emulated_python(tmp_path):
    """box64 -> probe -> x86_python (distro interpreter via the emulator) -> env file."""
    py = shutil.which("python3", path="/usr/bin:/bin")
    candidates = {"distro": {"candidates": [py]}}
    ctx = board_ctx(tmp_path, "box64-standin-new", x86_python=candidates)
    steps = [
        s for s in all_steps() if s.name in ("box64", "pagesize_probe", "x86_python", "envfile")
    ]
    outcomes = plan.apply_run(ctx, steps)
    assert plan.exit_code(outcomes, dry=False) == 0, [(o.name, o.error) for o in outcomes]
    env = (tmp_path / "config" / "torch-fl" / "env").read_text()
    assert f"FLAGOS_BPU_EMULATOR={STANDINS / 'box64-standin-new'}" in env
    assert f"FLAGOS_BPU_X86_PYTHON={py}" in env
    again = plan.apply_run(ctx, steps)
    assert [o.action for o in again] == ["none"] * 4

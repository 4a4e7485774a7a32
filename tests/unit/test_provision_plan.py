"""Plan construction, apply/re-check, resume and the report schema, with recorded step results."""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass, field

import pytest

from provision import config, plan, report, wheels
from provision.context import Context, Options
from provision.results import FAILED, NEEDED, OK, Box64Found, CheckResult, Inputs, StepError
from provision.target import LocalTarget


@dataclass
class RecordedStep:
    """Replays recorded check results; apply flips the state like an install would."""

    name: str
    states: list[str]
    apply_raises: bool = False
    applied: list[str] = field(default_factory=list)
    title: str = "recorded"
    requires: tuple[str, ...] = ()

    def check(self, ctx, inputs):
        return CheckResult(
            self.states[0], {"n": len(self.applied)}, f"{self.name} {self.states[0]}"
        )

    def apply(self, ctx, before, inputs):
        self.applied.append(before.status)
        if self.apply_raises:
            raise StepError("disk full; free space and re-run")
        self.states.pop(0)


def ctx(tmp_path):
    return Context(
        LocalTarget(), {}, config.load(), Options(), tmp_path, tmp_path, echo=lambda m: None
    )


def test_plan_applies_only_needed_and_rechecks(tmp_path):
    a, b = RecordedStep("a", [OK]), RecordedStep("b", [NEEDED, OK])
    out = plan.apply_run(ctx(tmp_path), [a, b])
    assert [o.action for o in out] == ["none", "apply"]
    assert out[1].before.status == NEEDED and out[1].after.status == OK
    assert a.applied == [] and b.applied == [NEEDED]
    assert plan.exit_code(out, dry=False) == 0


def test_dry_run_applies_nothing(tmp_path):
    a, b = RecordedStep("a", [NEEDED, OK]), RecordedStep("b", [FAILED])
    out = plan.dry_run(ctx(tmp_path), [a, b])
    assert [o.action for o in out] == ["would apply", "after a"]
    assert a.applied == [] and plan.exit_code(out, dry=True) == 0


def test_failure_stops_and_exits_1(tmp_path):
    a = RecordedStep("a", [NEEDED, NEEDED], apply_raises=True)
    b = RecordedStep("b", [NEEDED, OK])
    out = plan.apply_run(ctx(tmp_path), [a, b])
    assert out[0].error.startswith("disk full") and out[1].action == "not run"
    assert b.applied == [] and plan.exit_code(out, dry=False) == 1


def test_failed_check_is_not_applied(tmp_path):
    a = RecordedStep("a", [FAILED])
    out = plan.apply_run(ctx(tmp_path), [a])
    assert a.applied == [] and out[0].error == "a failed" and plan.exit_code(out, dry=False) == 1


def test_apply_that_does_not_fix_is_a_failure(tmp_path):
    a = RecordedStep("a", [NEEDED, NEEDED])
    a.apply = lambda c, before, inputs: (
        None
    )  # claims success, changes nothing: the re-check catches it
    out = plan.apply_run(ctx(tmp_path), [a])
    assert out[0].after.status == NEEDED and plan.exit_code(out, dry=False) == 1


def _report(outcomes, **kw):
    cfg = config.parse(config.deep_merge(config.defaults(), {"prefix": "p"}))
    base = dict(
        target="t",
        local=True,
        dry=False,
        started=0.0,
        facts={},
        outcomes=outcomes,
        artifacts=[{"name": "x.whl", "sha256": "a" * 64}],
        exit_code=0,
        config=cfg,
    )
    base.update(kw)
    return report.build(**base)


def test_report_roundtrip_and_validation(tmp_path):
    out = plan.apply_run(ctx(tmp_path), [RecordedStep("a", [NEEDED, OK])])
    doc = _report(out)
    report.validate(doc)
    path = tmp_path / "r" / "report.json"
    report.write_atomic(path, doc)
    assert json.loads(path.read_text())["actions"] == 1
    assert [p.name for p in path.parent.iterdir()] == ["report.json"]  # no temp files left
    bad = json.loads(path.read_text())
    bad["actions"] = 0
    with pytest.raises(ValueError, match="actions"):
        report.validate(bad)
    bad = _report(out, artifacts=[{"name": "x", "sha256": "short"}])
    with pytest.raises(ValueError, match="sha256"):
        report.validate(bad)
    assert "a" in report.table(out) and "apply" in report.table(out)


def test_wheel_requirements_split(tmp_path):
    whl = tmp_path / "hbdk4_compiler-4.1.0-cp311-cp311-manylinux_2_17_x86_64.whl"
    meta = (
        "Metadata-Version: 2.1\nName: hbdk4-compiler\nRequires-Dist: numpy>=1.21\n"
        "Requires-Dist: numba\nRequires-Dist: torch (>=1.13)\nRequires-Dist: hbdk4-march==4.1.0\n"
        'Requires-Dist: pytest; extra == "test"\nRequires-Dist: onnx<1.17,>=1.14\n'
    )
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("hbdk4_compiler-4.1.0.dist-info/METADATA", meta)
    reqs = wheels.requires_dist(whl)
    install, shimmed = wheels.split_requirements(reqs, provided={"hbdk4_march", "hbdk4_compiler"})
    assert install == ["numpy>=1.21", "onnx<1.17,>=1.14"]
    assert shimmed == ["numba", "torch (>=1.13)"]
    assert wheels.wheel_project(whl.name) == "hbdk4_compiler"
    assert set(wheels.list_wheels(tmp_path)) == {whl.name}
    with pytest.raises(ValueError, match="no .whl"):
        wheels.list_wheels(_empty(tmp_path))


def _empty(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    return d


@dataclass
class Consumer:
    """Records the inputs the plan hands it."""

    name: str = "envfile"
    title: str = "consumer"
    requires: tuple[str, ...] = ("box64",)
    seen: list = field(default_factory=list)

    def check(self, ctx, inputs):
        self.seen.append(inputs)
        return CheckResult(OK, {}, "ok")

    def apply(self, ctx, before, inputs):
        raise AssertionError("never needed")


@dataclass
class Provider:
    name: str = "box64"
    title: str = "provider"
    requires: tuple[str, ...] = ()
    checks: int = 0

    def check(self, ctx, inputs):
        self.checks += 1
        return CheckResult(OK, {}, "ok", Box64Found("/opt/box64", "0.4.5"))

    def apply(self, ctx, before, inputs):
        raise AssertionError("never needed")


def test_plan_hands_a_step_the_results_it_requires(tmp_path):
    provider, consumer = Provider(), Consumer()
    plan.apply_run(ctx(tmp_path), [provider, consumer])
    assert provider.checks == 1  # the run's result is reused, not checked again
    assert consumer.seen == [Inputs(box64=Box64Found("/opt/box64", "0.4.5"))]


def test_required_step_left_out_is_checked_read_only(tmp_path):
    consumer = Consumer()
    c = ctx(tmp_path)
    c.facts["arch"] = "x86_64"  # the real box64 step: not applicable, provides nothing
    out = plan.dry_run(c, [consumer])
    assert [o.name for o in out] == ["envfile"]  # the dependency is not reported as run
    assert consumer.seen == [Inputs(box64=None)]


def test_a_multi_line_detail_keeps_its_lines_under_the_column() -> None:
    from provision.report import wrapped_table

    coverage = "BPU coverage: 4/4 (100.0%)\ngraph part executor\n    0    0 sim"
    text = wrapped_table([("step", "detail"), ("build_verify", coverage)], width=100)
    lines = text.splitlines()
    assert lines[2].endswith("BPU coverage: 4/4 (100.0%)")
    column = lines[2].index("BPU")
    assert lines[3][column:] == "graph part executor" and lines[4][column:] == "    0    0 sim"
    assert lines[3][:column].strip() == "" and lines[4][:column].strip() == ""

"""pytest plugin: apply matrix.yaml expectations to one lane as strict expected failures.

Loaded with `-p scripts.testmatrix.plugin --matrix-lane NAME`; inert without `--matrix-lane`.

- An expected failure that fails the way the entry says (fail / error / crash, optional `match`
  regex) is reported as xfailed.
- If it passes, the test FAILS with "remove this expectation": known failures must not outlive
  their cause.
- If it fails differently (a crash where a plain failure was expected, an unmatched message),
  it stays a failure and says why.
- An active entry that matches no selected test is an error (stale entries rot silently).

Each finished test is appended to `--matrix-results` (JSON lines, flushed per test) so the runner
can bucket outcomes even when it had to kill a lane on timeout.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from scripts.testmatrix.schema import Expectation, load

# Text that shows a process died rather than failed an assertion; a `crash` expectation needs
# one of these in the failure (subprocess tests should put the child's stderr/rc in their message).
CRASH_TEXT = re.compile(
    r"Segmentation fault|SIG(SEGV|ABRT|BUS|ILL|FPE)|double free|corruption|terminate called"
    r"|core dumped|Fatal Python error|crashed while running|died with signal"
)
_EXPECTATION = pytest.StashKey[Expectation]()
_PAST = {"fail": "failed", "error": "errored", "crash": "crashed"}
# When phases disagree (setup/call/teardown), the worst one decides the test's bucket.
_RANK = ["passed", "skipped", "expected-fail", "failed", "unexpected-pass", "infra-error"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("matrix", "test matrix expectations (scripts/testmatrix)")
    group.addoption("--matrix-file", default="matrix.yaml", help="matrix file (matrix.yaml)")
    group.addoption("--matrix-lane", default=None, help="lane whose expectations apply")
    group.addoption("--matrix-caps", default=None, help="JSON capabilities (default: detect)")
    group.addoption("--matrix-results", default=None, help="append per-test JSON lines here")
    group.addoption(
        "--matrix-subset",
        action="store_true",
        default=False,
        help="only some of the lane's tests run (a rerun): skip the stale-expectation check",
    )


class MatrixPlugin:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.lane: str = config.getoption("matrix_lane")
        matrix_file = Path(config.getoption("matrix_file"))
        if not matrix_file.is_absolute():
            matrix_file = Path(config.rootpath) / matrix_file
        caps_file = config.getoption("matrix_caps")
        if caps_file:
            caps: dict[str, Any] = json.loads(Path(caps_file).read_text(encoding="utf-8"))
        else:
            from scripts.testmatrix.capabilities import detect

            caps = detect()
        matrix = load(matrix_file)
        if self.lane not in matrix.lanes:
            raise pytest.UsageError(f"--matrix-lane {self.lane!r} is not a lane in {matrix_file}")
        self.active = [e for e in matrix.expectations if e.active(self.lane, caps)]
        self.results_path = config.getoption("matrix_results")
        self.stale: list[Expectation] = []
        self.phase_bucket: dict[str, str] = {}
        self.messages: dict[str, str] = {}
        self.is_worker = hasattr(config, "workerinput")
        self.subset = bool(config.getoption("matrix_subset"))
        self.expectation_of: dict[str, str] = {}
        self.counted = False

    # -- collection -------------------------------------------------------------------------

    def expectation_for(self, nodeid: str) -> Expectation | None:
        return next((e for e in self.active if e.matches(nodeid)), None)

    def check_stale(self, nodeids: list[str]) -> None:
        if not self.is_worker and not self.counted:
            self.counted = True  # the runner's heartbeat shows "done / total"
            self.emit({"event": "collected", "count": len(nodeids)})
        for nodeid in nodeids:
            exp = self.expectation_for(nodeid)
            if exp is not None:
                self.expectation_of[nodeid] = exp.location
        if self.subset:
            return  # a rerun selects some tests only; staleness needs the whole lane
        self.stale = [e for e in self.active if not any(e.matches(n) for n in nodeids)]

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        # Started-but-unfinished tests are the ones named when a lane hangs or is interrupted.
        if not self.is_worker:
            self.emit({"event": "start", "nodeid": nodeid})

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        # trylast: -k / -m deselection has happened, so entries are checked against the lane's
        # real selection.
        for item in items:
            exp = self.expectation_for(item.nodeid)
            if exp is not None:
                item.stash[_EXPECTATION] = exp
                item.user_properties.append(("matrix_expectation", exp.location))
                item.user_properties.append(("matrix_expected_status", exp.status))
            item.user_properties.append(("nodeid", item.nodeid))
        self.check_stale([item.nodeid for item in items])

    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        # Controller side under xdist: workers collect, the controller only sees ids.
        self.check_stale(list(ids))

    # -- outcomes ---------------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> pytest.TestReport:
        rep: pytest.TestReport = yield
        exp = item.stash.get(_EXPECTATION, None)
        if exp is None or (rep.skipped and not hasattr(rep, "wasxfail")):
            return rep
        if rep.failed:
            actual = (
                "crash"
                if CRASH_TEXT.search(rep.longreprtext)
                else ("fail" if call.when == "call" else "error")
            )
            self.judge(rep, exp, actual)
        elif rep.passed and call.when == "call":
            rep.outcome = "failed"
            rep.longrepr = (
                f"[XPASS(strict)] {item.nodeid} passed, but {exp.location} expects it to "
                f"{exp.status} ({exp.reason}); remove this expectation or narrow its `when`."
            )
            rep.matrix_bucket = "unexpected-pass"  # type: ignore[attr-defined]
        return rep

    def judge(self, rep: pytest.TestReport, exp: Expectation, actual: str) -> None:
        text = rep.longreprtext
        problem = None
        if actual != exp.status:
            problem = f"expected to {exp.status} but it {_PAST[actual]}"
        elif exp.match and not re.search(exp.match, text):
            problem = f"failure text does not match {exp.match!r}"
        if problem is None:
            rep.outcome = "skipped"
            rep.wasxfail = f"{exp.reason} ({exp.location}; {exp.link})"  # type: ignore[attr-defined]
            rep.matrix_bucket = "expected-fail"  # type: ignore[attr-defined]
        else:
            rep.longrepr = f"[matrix] {exp.location}: {problem}\n{text}"

    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        # A test that kills its xdist worker: infra-error, unless a `crash` entry expects it.
        exp = self.expectation_for(crashitem)
        if exp is not None and exp.status == "crash":
            report.outcome = "skipped"
            report.wasxfail = f"{exp.reason} ({exp.location}; {exp.link})"  # type: ignore[attr-defined]
            report.matrix_bucket = "expected-fail"  # type: ignore[attr-defined]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.is_worker:
            return
        nodeid = report.nodeid
        bucket = getattr(report, "matrix_bucket", None)
        if bucket is None:
            if report.when == "???":
                bucket = "infra-error"  # xdist worker crash
            elif report.failed:
                bucket = "failed"
            elif report.skipped:
                bucket = "expected-fail" if hasattr(report, "wasxfail") else "skipped"
            else:
                bucket = "passed"
        previous = self.phase_bucket.get(nodeid, "passed")
        if _RANK.index(bucket) >= _RANK.index(previous):
            self.phase_bucket[nodeid] = bucket
            if bucket != "passed":
                self.messages[nodeid] = _first_line(report)
        if report.when in ("teardown", "???"):
            self.emit(
                {
                    "nodeid": nodeid,
                    "bucket": self.phase_bucket.pop(nodeid),
                    "message": self.messages.pop(nodeid, ""),
                    "expectation": self.expectation_of.get(nodeid),
                }
            )

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed and not self.is_worker:
            self.emit(
                {"event": "collect-error", "nodeid": report.nodeid, "message": _first_line(report)}
            )

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.is_worker:
            return
        for exp in self.stale:
            self.emit(
                {
                    "event": "stale",
                    "expectation": exp.location,
                    "message": f"{exp.location}: expectation {exp.test!r} matches no test in lane "
                    f"{self.lane!r}; remove it or fix the pattern",
                }
            )
        if self.stale and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for exp in self.stale:
            terminalreporter.write_line(
                f"ERROR {exp.location}: stale expectation {exp.test!r} matches no test in lane "
                f"{self.lane!r}; remove it or fix the pattern",
                red=True,
            )

    def emit(self, record: dict[str, Any]) -> None:
        if not self.results_path:
            return
        with open(self.results_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def _first_line(report: Any) -> str:
    if hasattr(report, "wasxfail"):
        return str(report.wasxfail)
    text = report.longreprtext if report.longrepr is not None else ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # The last "E   ..." line is usually the assertion; fall back to the last line.
    errors = [ln for ln in lines if ln.startswith("E ")]
    return (errors[0] if errors else (lines[-1] if lines else ""))[:300]


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("matrix_lane"):
        config.pluginmanager.register(MatrixPlugin(config), "testmatrix")

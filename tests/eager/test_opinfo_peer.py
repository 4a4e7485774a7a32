"""The OpInfo peer suite (tests/eager/opinfo_peer.py): one test per op of PyTorch's OpInfo
database, float32 and complex64 samples, flagos against the CPU. The ops run in forked children
(a crash fails that op's test, not the lane); the first test runs every selected op, the others
read their reports."""

from __future__ import annotations

import os

import pytest

from tests.eager import opinfo_peer

OPS = opinfo_peer.load_ops()
# Filled as the ops run; conftest.py prints its totals at the end of the session.
REPORTS: dict[str, opinfo_peer.OpReport] = {}
BATCH = 80  # ops per batch of forked children


def _param(name: str) -> object:
    treatment, reason = opinfo_peer.EXCLUSIONS.get(name, ("", ""))
    marks = [pytest.mark.skip(reason=reason)] if treatment == opinfo_peer.SKIP else []
    return pytest.param(name, marks=marks, id=name)


def _selected_names(session: pytest.Session) -> list[str]:
    names = []
    for item in session.items:
        if item.module is not None and item.module.__name__ == __name__:
            if item.get_closest_marker("skip") is None and hasattr(item, "callspec"):
                names.append(item.callspec.params["name"])
    return names


@pytest.mark.parametrize("name", [_param(name) for name in sorted(OPS)])
def test_op_matches_cpu(name: str, request: pytest.FixtureRequest) -> None:
    reports = REPORTS
    if name not in reports:
        # This op and the next selected ones run as one batch (forking per op costs more than
        # most ops); batches stay well inside the per-test timeout. Under xdist each worker runs
        # only its own tests, so it runs them one at a time.
        if os.environ.get("PYTEST_XDIST_WORKER"):
            batch = [name]
        else:
            selected = _selected_names(request.session)
            rest = [n for n in selected[selected.index(name) :] if n not in reports]
            batch = rest[:BATCH]
        reports.update(opinfo_peer.run_isolated(OPS, batch))
    report = reports[name]
    if report.crash:
        pytest.fail(f"{name} crashed: {report.crash}", pytrace=False)
    if report.failures:
        pytest.fail(f"{name}:\n" + "\n".join(report.failures), pytrace=False)
    if report.samples == 0:
        pytest.skip("OpInfo yields no float32/complex64 sample for this op")

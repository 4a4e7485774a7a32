import sys

import pytest
import torch

from tests.eager.parity import DEV


@pytest.fixture
def dev() -> torch.device:
    return DEV


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    # The test module's import name depends on pytest's import mode: find it by its file name.
    peer = next(
        (m for n, m in list(sys.modules.items()) if n.rpartition(".")[2] == "test_opinfo_peer"),
        None,
    )
    if peer is not None and getattr(peer, "REPORTS", None):
        from tests.eager import opinfo_peer

        terminalreporter.write_line("OpInfo peer suite: " + opinfo_peer.totals(peer.REPORTS))

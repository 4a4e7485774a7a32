"""Bring back a board that does not answer, where its place has power control.

A hung board is one whose SSH port accepts no connection. If the place has a power resource,
labgrid switches it off and on (`labgrid-client power cycle`, through whatever power switch the
exporter describes) and the board gets `boot_timeout` seconds to answer again. A host-key or
login problem is not a hang: the port answers, and power-cycling would not fix it.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from scripts.farm.labgrid_client import LabgridClient


def answers(address: str, port: int, timeout: float = 5.0) -> bool:
    """Does anything accept a TCP connection on the board's SSH port?"""
    try:
        socket.create_connection((address, port), timeout=timeout).close()
        return True
    except OSError:
        return False


def recover(
    client: LabgridClient,
    place: str,
    address: str,
    port: int,
    boot_timeout: float,
    echo: Callable[[str], None],
) -> bool:
    """Power-cycle the place and wait for its SSH port; True when it answers again."""
    echo(f"no answer on {address}:{port}; power-cycling the place")
    client.run("-p", place, "power", "cycle", timeout=120)
    deadline = time.monotonic() + boot_timeout
    while time.monotonic() < deadline:
        if answers(address, port, timeout=2.0):
            echo("answers again after the power cycle")
            return True
        time.sleep(1.0)
    return False

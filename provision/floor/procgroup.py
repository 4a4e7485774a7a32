"""Stopping a command together with everything it started.

A command started with `start_new_session=True` leads its own process group. Killing only its
pid would leave its children (a compiler, pytest's workers, an ssh) running, still holding
files, ports and the terminal; signalling the group reaches all of them.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any


def kill_group(proc: subprocess.Popen[Any], grace_s: float = 3.0) -> None:
    """Stop `proc`'s process group (`proc` must lead it): SIGTERM, up to `grace_s` seconds for
    `proc` to exit, then SIGKILL and as long again. Returns once `proc` has exited, the group is
    gone, or both waits ran out; never raises for a process that is already gone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue

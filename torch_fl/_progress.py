"""A heartbeat for work that can take more than a few seconds: elapsed time and progress.

On a terminal the line is redrawn about once a second; in a log (CI, a pipe) one line is written
every `interval` seconds (30 by default) so minutes of silence never look like a hang, and an
hour-long build adds about a hundred lines, not thousands.

This module imports nothing from torch or torch_fl, so the harness (scripts/, provision/) can load
it by file path without importing torch; the compile backend imports it normally.

    with Heartbeat("compile lane", total=120) as hb:
        ...
        hb.update(done=17, note="tests/compile/test_cache.py")
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TextIO

DEFAULT_INTERVAL_S = 30.0
LIVE_INTERVAL_S = 1.0
# Tests and impatient users shorten the log interval without a code change.
INTERVAL_ENV = "TORCH_FL_HEARTBEAT_S"


def _is_live(stream: TextIO) -> bool:
    if os.environ.get("CI"):
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def format_elapsed(seconds: float) -> str:
    """`42s`, `3m05s`, `1h02m`: short enough for a status line."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


class Heartbeat:
    """Prints `[label] 1m30s elapsed, 12/80 done: note` while a `with` block runs."""

    def __init__(
        self,
        label: str,
        *,
        total: int | None = None,
        stream: TextIO | None = None,
        interval: float | None = None,
        live: bool | None = None,
    ) -> None:
        self.label = label
        self.total = total
        self.done: int | None = None
        self.note = ""
        self.stream = stream or sys.stderr
        self.live = _is_live(self.stream) if live is None else live
        if interval is None:
            env = os.environ.get(INTERVAL_ENV, "")
            try:
                interval = float(env) if env else None
            except ValueError:
                interval = None
        if interval is None or interval <= 0:
            interval = LIVE_INTERVAL_S if self.live else DEFAULT_INTERVAL_S
        self.interval = interval
        self.started = time.monotonic()
        self.beats = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._drawn = False

    def update(
        self, done: int | None = None, total: int | None = None, note: str | None = None
    ) -> None:
        with self._lock:
            if done is not None:
                self.done = done
            if total is not None:
                self.total = total
            if note is not None:
                self.note = note

    def line(self) -> str:
        """The status line as it would be printed now."""
        parts = [f"[{self.label}] {format_elapsed(time.monotonic() - self.started)} elapsed"]
        with self._lock:
            if self.done is not None:
                parts.append(f", {self.done}/{self.total if self.total is not None else '?'} done")
            if self.note:
                parts.append(f": {self.note}")
        return "".join(parts)

    def _beat(self) -> None:
        text = self.line()
        try:
            if self.live:
                width = 120
                self.stream.write("\r" + text[:width].ljust(width))
                self._drawn = True
            else:
                self.stream.write(text + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            self._stop.set()  # the stream went away (closed pipe): stop beating, keep working
        self.beats += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._beat()

    def start(self) -> Heartbeat:
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat:{self.label}")
        self._thread.daemon = True
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        if self.live and self._drawn:
            try:
                self.stream.write("\r" + " " * 120 + "\r")
                self.stream.flush()
            except (OSError, ValueError):
                pass

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

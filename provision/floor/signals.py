"""SIGTERM (and, where asked, SIGINT) raised as KeyboardInterrupt, so work stops the same way.

A CI runner, `timeout` or a supervisor ends a job with SIGTERM, whose default action kills the
process at once: no `finally` runs, a report is half written, children keep running. Turned into
the KeyboardInterrupt that Ctrl-C raises, it reaches the one `except KeyboardInterrupt` that
already stops a run cleanly and exits 130 (exitcodes.INTERRUPTED).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn


def raise_interrupt(signum: int, frame: object) -> NoReturn:
    """A signal handler: raise KeyboardInterrupt naming the signal."""
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def as_interrupt(
    signums: Iterable[int] = (signal.SIGTERM,),
    on_signal: Callable[[int], None] | None = None,
) -> Iterator[None]:
    """Within the block, each of `signums` raises KeyboardInterrupt, after `on_signal(signum)`
    (which may record which signal came). The previous handlers come back when the block ends.

    Off the main thread Python cannot set handlers; the block then runs with signals left as
    they are (an embedding tool keeps its own handling).
    """

    def handler(signum: int, frame: object) -> NoReturn:
        if on_signal is not None:
            on_signal(signum)
        raise_interrupt(signum, frame)

    previous: dict[int, Any] = {}
    try:
        for signum in signums:
            previous[signum] = signal.signal(signum, handler)
    except ValueError:  # not the main thread
        _restore(previous)
        yield
        return
    try:
        yield
    finally:
        _restore(previous)


def _restore(previous: dict[int, Any]) -> None:
    for signum, old in previous.items():
        signal.signal(signum, old)

"""Drain the autograd engine's `flagos` device thread before the interpreter finalises.

Why: backward on a non-CPU device runs on the engine's device thread ("pt_autograd_0"). torch
(2.13) stashes a Python object in the thread-local state every GraphTask captures
(`torch._C._stash_obj_in_tls("context", ...)` in `torch.autograd.graph._engine_run_backward`).
The caller wakes as soon as the task is marked complete, but the device thread may still hold
the last reference to the GraphTask; dropping it decrefs that Python object and so takes the
GIL. When the script ends right after `backward()`, that can happen while Python is finalising:
CPython then calls `pthread_exit` inside `take_gil`, the forced unwind crosses a `noexcept`
destructor, and the process dies with "terminate called without an active exception" (rc -6,
seen about 1 run in 50 on a busy 2-core machine).

The fix is a barrier at `atexit` time, while the interpreter still runs normally: a tiny
backward pass whose only node runs on the same device thread. The thread works through its
queue in order and releases each task before taking the next, so once the barrier is done the
user's GraphTask and its Python object are gone. The barrier is issued straight to the engine,
without the stash, so its own GraphTask holds no Python object.

`FLAGOS_EXIT_DRAIN=0` (read at exit) switches the barrier off: an escape hatch, and the
baseline `scripts/stress_exit.py` measures the fix against.
"""

from __future__ import annotations

import atexit
import os

import torch

from torch_fl.device import DEVICE_TYPE
from torch_fl.envfile import get as envfile_get

__all__ = ["device_thread_running", "drain_device_threads", "install"]

_THREAD_PREFIX = "pt_autograd_"  # the name the engine gives its device threads


def device_thread_running() -> bool:
    """Whether an autograd device thread exists in this process (Linux: /proc/self/task)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return True  # cannot tell: drain anyway, it is cheap once the thread exists
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm", encoding="utf-8") as comm:
                if comm.read().startswith(_THREAD_PREFIX):
                    return True
        except OSError:
            continue  # the thread ended while we looked
    return False


def drain_device_threads() -> bool:
    """Run one backward node on the `flagos` device thread and wait for it; True if it ran.

    Skipped when no device thread exists: starting one at exit would cost time for nothing,
    and in a forked child the engine's threads are gone, so a barrier would wait forever.
    """
    if not device_thread_running():
        return False
    with torch.enable_grad():
        leaf = torch.ones(1, device=DEVICE_TYPE, requires_grad=True)
        out = leaf * 2
        seed = torch.ones(1, device=DEVICE_TYPE)
        # Straight to the engine, not through torch.autograd.backward/grad: nothing is stashed
        # in the thread-local state the task captures. And accumulate (into leaf.grad) instead
        # of capturing: captured gradients come back as Python tensors that the task's future
        # also references, and the device thread may be the one to drop that future, which
        # would take the GIL again; an accumulating task's future holds nothing.
        torch.autograd.Variable._execution_engine.run_backward(
            (out,), (seed,), False, False, (), True, True
        )
    return True


def _drain_at_exit() -> None:
    try:
        if (envfile_get("FLAGOS_EXIT_DRAIN") or "1").strip() == "0":
            return
        drain_device_threads()
    except Exception:  # noqa: BLE001 - an exit hook must never turn a clean exit into a crash
        pass


def install() -> None:
    """Register the exit barrier once per process (calling it again changes nothing)."""
    atexit.unregister(_drain_at_exit)
    atexit.register(_drain_at_exit)

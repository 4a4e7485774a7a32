"""The exit barrier for the autograd engine's flagos device thread (torch_fl/autograd_exit.py).

The crash it prevents is a race at interpreter exit (the device thread drops the last reference
to a GraphTask that holds a Python object while Python finalises). test_exit_clean.py repeats the
autograd exit case for the end-to-end view; these tests pin down the barrier's own contract.
"""

from __future__ import annotations

import sys

import torch

import torch_fl  # noqa: F401 - registers the flagos device
from tests.support.process import run_python
from torch_fl import autograd_exit


def test_drain_releases_the_graph_task_the_device_thread_still_holds():
    """After a drain, the device thread holds no reference to the last backward's Python TLS.

    A probe object rides in the thread-local state every GraphTask captures, as torch's own
    "context" object does. A huge switch interval keeps the GIL with this thread, so whenever the
    device thread still holds the GraphTask after backward() returns, it cannot drop it on its
    own: only a barrier that releases the GIL and waits for the device thread clears it.
    """
    previous = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    held_after_backward = held_after_drain = 0
    try:
        for _ in range(300):
            probe = object()
            base = sys.getrefcount(probe)
            torch._C._stash_obj_in_tls("torch_fl_probe", probe)
            w = torch.randn(8, 8, device="flagos", requires_grad=True)
            (w @ w).sum().backward()
            torch._C._remove_obj_from_tls("torch_fl_probe")
            held_after_backward += sys.getrefcount(probe) > base
            assert autograd_exit.drain_device_threads() is True
            held_after_drain += sys.getrefcount(probe) > base
    finally:
        sys.setswitchinterval(previous)
    assert held_after_drain == 0, (
        f"the device thread still held a GraphTask after {held_after_drain} drains "
        f"(it held one right after backward {held_after_backward} times)"
    )


def test_drain_is_skipped_until_a_device_thread_exists():
    code = (
        "import torch, torch_fl\n"
        "from torch_fl import autograd_exit as ae\n"
        "print(ae.device_thread_running(), ae.drain_device_threads(), ae.device_thread_running())\n"
        "w = torch.ones(2, device='flagos', requires_grad=True); (w * 3).sum().backward()\n"
        "print(ae.device_thread_running(), ae.drain_device_threads(), w.grad.cpu().tolist())\n"
    )
    done = run_python(code, {"PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr
    before, after = done.stdout.strip().splitlines()
    assert before == "False False False", "no backward yet: nothing to drain, no thread started"
    assert after == "True True [3.0, 3.0]"


def test_drain_in_a_forked_child_returns_at_once():
    """Threads do not survive fork(): a barrier in the child would wait forever, so it is skipped."""
    code = (
        "import os, torch, torch_fl\n"
        "from torch_fl import autograd_exit as ae\n"
        "w = torch.ones(2, device='flagos', requires_grad=True); (w * 3).sum().backward()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(0 if ae.drain_device_threads() is False else 3)\n"
        "print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
    )
    done = run_python(code, {"PYTHONWARNINGS": "ignore"}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"


def test_exit_hook_honours_flagos_exit_drain(monkeypatch):
    calls: list[bool] = []
    monkeypatch.setattr(autograd_exit, "drain_device_threads", lambda: calls.append(True))
    monkeypatch.setenv("FLAGOS_EXIT_DRAIN", "0")
    autograd_exit._drain_at_exit()
    assert calls == [], "FLAGOS_EXIT_DRAIN=0 must switch the barrier off"
    monkeypatch.delenv("FLAGOS_EXIT_DRAIN")
    autograd_exit._drain_at_exit()
    assert calls == [True], "the barrier runs by default"

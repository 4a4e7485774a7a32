"""Helpers for profiler tests: capture a workload's chrome trace and pick events from it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile


def capture(
    workload: Callable[[], object], tmp_path: Path, activities: list[ProfilerActivity]
) -> list[dict]:
    with profile(activities=activities, record_shapes=True) as prof:
        workload()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())["traceEvents"]


def complete_events(events: list[dict], name_prefix: str) -> list[dict]:
    return [
        e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith(name_prefix)
    ]


def aten_sequence(events: list[dict], ops: set[str]) -> list[str]:
    """The aten ops of interest in start-time order (the structure of a workload), each op once.

    An op inside a range of the same op on the same thread is that op run again, not a new one:
    the flagos fallback re-dispatches `aten::mm` to the CPU kernel inside the device's `aten::mm`.
    Ops inside *other* ops stay (`aten::mm` under `aten::matmul` is the workload's structure on
    every device).
    """
    picked = sorted(
        (e for e in events if e.get("ph") == "X" and e.get("name") in ops), key=lambda e: e["ts"]
    )
    kept: list[dict] = []
    for event in picked:
        if not any(_inside(event, outer) for outer in kept if outer["name"] == event["name"]):
            kept.append(event)
    return [e["name"] for e in kept]


def _inside(event: dict, outer: dict) -> bool:
    same_thread = (event.get("pid"), event.get("tid")) == (outer.get("pid"), outer.get("tid"))
    starts_in = outer["ts"] <= event["ts"]
    return same_thread and starts_in and event["ts"] + event["dur"] <= outer["ts"] + outer["dur"]


def matmul_workload(device: str) -> Callable[[], object]:
    a = torch.randn(128, 128, device=device)
    b = torch.randn(128, 128, device=device)

    def run() -> object:
        out = a
        for _ in range(10):
            out = torch.relu(out @ b)
        if device == "cuda":
            torch.cuda.synchronize()
        return out

    return run

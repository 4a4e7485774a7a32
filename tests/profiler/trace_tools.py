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
    """Top-level aten ops of interest in start-time order (the structure of a workload)."""
    picked = [e for e in events if e.get("ph") == "X" and e.get("name") in ops]
    return [e["name"] for e in sorted(picked, key=lambda e: e["ts"])]


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

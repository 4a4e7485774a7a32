"""Helpers for compile-lane tests."""

from __future__ import annotations

from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
STANDINS = HERE.parent / "standins"


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()


def compile_bpu(model, **options):
    return torch.compile(model, backend="bpu", options=options or None, dynamic=False)


def runtimes(reports):
    return [r for g in reports for r in g.runtimes]

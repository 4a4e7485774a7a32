"""The provisioning steps, one module each, in pipeline order.

A step module imports only `provision.context`, `provision.results` and helpers below them,
never another step's check: what it needs from an earlier step it names in `requires`, and the
plan hands it that step's typed result (see provision/results.py).
"""

from __future__ import annotations

from provision import step_names
from provision.context import Context, Options, Step
from provision.steps import (
    box64,
    build_verify,
    envfile,
    pagesize_probe,
    prereqs,
    torch_env,
    torch_fl_build,
    vendor_runtime,
    x86_python,
)

__all__ = ["STEP_NAMES", "Context", "Options", "Step", "all_steps"]

_PIPELINE: tuple[Step, ...] = (
    prereqs.STEP,
    box64.STEP,
    pagesize_probe.STEP,
    x86_python.STEP,
    vendor_runtime.STEP,
    envfile.STEP,
    torch_env.STEP,
    torch_fl_build.STEP,
    build_verify.STEP,
)
STEP_NAMES: tuple[str, ...] = step_names.STEP_NAMES
if tuple(step.name for step in _PIPELINE) != STEP_NAMES:  # the configuration checks against it
    raise RuntimeError("provision/step_names.py must list the pipeline's steps in its order")


def all_steps() -> list[Step]:
    return list(_PIPELINE)

"""What one provisioning run is given, read from the command line the same way by every command.

`invoke provision` and `invoke farm.provision` / `farm.test` take the same --config, --only,
--skip and --artifacts flags and keep the same controller-side scratch; reading them here once
keeps the commands from drifting apart (a check one of them forgot, another scratch directory).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision import config as config_mod
from provision import plan
from provision.floor import outpaths
from provision.settings import Settings


@dataclass(frozen=True)
class RunInputs:
    """The provisioning flags, checked: what `pipeline.run_steps` needs besides a target."""

    cfg: Settings  # provision.yaml with --config and invoke.yaml's `provision` merged in
    steps: list[str]  # the steps --only/--skip select, in pipeline order
    artifacts: Path | None  # --artifacts: an existing directory, or None when not given


def read(
    section: Any,
    config: str | None,
    only: str | None,
    skip: str | None,
    artifacts: str | None,
) -> RunInputs:
    """The config, then the selected steps, then --artifacts, in that order (the first problem
    is the one reported). `section` is invoke's `provision` config section (None when absent).

    Raises config.ConfigError or ValueError, whose message names the flag and the fix; the
    caller turns it into its exit 2.
    """
    cfg = config_mod.load(config, config_mod.invoke_section(section, "provision"))
    steps = plan.select(only, skip, cfg.steps.skip)
    return RunInputs(cfg, steps, artifacts_dir(artifacts))


def artifacts_dir(value: str | None) -> Path | None:
    """The --artifacts directory: None when not given; an empty value is a mistake, never
    "no artifacts" (`--artifacts "$UNSET"`)."""
    if value is None:
        return None
    if not value.strip():
        raise ValueError("--artifacts '' is empty; give a directory or leave the flag out")
    path = Path(value).expanduser()
    problem = outpaths.lookup_problem(path)
    if problem:
        raise ValueError(f"--artifacts {outpaths.shown(value)}: {problem}")
    if not path.is_dir():
        raise ValueError(f"--artifacts {value} is not a directory")
    return path

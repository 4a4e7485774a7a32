"""A farm run's inputs, fixed before the first place is reserved."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from provision.settings import Settings
from provision.steps import Options
from scripts.farm.selection import Request
from scripts.farm.settings import FarmSettings


@dataclass
class FarmJob:
    """Everything a farm run needs, fixed before the first place is reserved."""

    settings: FarmSettings
    requests: list[Request]
    out_dir: Path
    root: Path
    work_root: Path
    provision_cfg: Settings
    selected_steps: list[str]
    options: Options = field(default_factory=Options)
    provision: bool = True
    lanes: list[str] = field(default_factory=list)  # empty: provision only
    matrix_file: str = "matrix.yaml"
    setup: str = "bootstrap"
    board_python: str | None = None
    insecure_host_key: bool = False
    reserve_timeout_s: float = 300.0
    lane_timeout_s: float = 3600.0
    boot_timeout_s: float = 300.0  # after a power cycle
    client_env: dict[str, str] = field(default_factory=dict)
    # This controller's BPU artifact cache, copied to each board before its lanes (None: not).
    ship_cache: Path | None = None

"""The controller's own scratch for provisioning, kept between runs.

Downloads, the probe build and the torch-fl wheels boards built live here, under
$XDG_CACHE_HOME/torch-fl/provision (~/.cache/...), on the machine running invoke, never on a
target. Standard library only: the steps (which may not import the run's plumbing) and the
commands both read it.
"""

from __future__ import annotations

import os
from pathlib import Path


def controller_cache() -> Path:
    """Controller-side scratch for provisioning (downloads, built wheels), kept between runs."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "torch-fl" / "provision"

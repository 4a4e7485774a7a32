"""Where labgrid's programs are: its own environment, never the project's .venv.

labgrid registers a pytest plugin in whatever environment holds it, so it is installed into
`.venv-farm` (scripts/bootstrap.sh, requirements-farm.txt) and used only as programs:
labgrid-client/-coordinator/-exporter, and that environment's python for resource lookups.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from scripts.farm.errors import FarmError

REPO = Path(__file__).resolve().parents[2]
INSTALL_HINT = (
    "labgrid is not installed: run scripts/bootstrap.sh, or `python3 -m venv .venv-farm && "
    ".venv-farm/bin/pip install -r requirements-farm.txt` (TORCH_FL_FARM_VENV names another venv)"
)


def bin_dir() -> Path:
    """The bin/ directory holding labgrid-client, or FarmError with the install command."""
    explicit = os.environ.get("TORCH_FL_FARM_VENV")
    candidates = [Path(explicit).expanduser() / "bin"] if explicit else []
    candidates.append(REPO / ".venv-farm" / "bin")
    for candidate in candidates:
        if (candidate / "labgrid-client").is_file():
            return candidate
    found = shutil.which("labgrid-client")
    if found:
        return Path(found).parent
    raise FarmError(INSTALL_HINT)


def tool(name: str) -> str:
    path = bin_dir() / name
    if not path.is_file():
        raise FarmError(f"{path} is missing; {INSTALL_HINT}")
    return str(path)


def python() -> str:
    """An interpreter that can import labgrid (the farm venv's)."""
    for name in ("python", "python3"):
        path = bin_dir() / name
        if path.is_file():
            return str(path)
    raise FarmError(f"no python next to labgrid-client in {bin_dir()}; {INSTALL_HINT}")

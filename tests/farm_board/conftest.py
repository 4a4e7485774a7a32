"""On-board checks, collected only inside the board-smoke lane (which sets TORCH_FL_FARM_BOARD).

A plain `pytest` on a development machine does not collect them (they describe a provisioned
board, not this host); the lane without its variable collects nothing, which the matrix runner
reports as an infra-error, never as a green lane.
"""

from __future__ import annotations

import os

if os.environ.get("TORCH_FL_FARM_BOARD") != "1":
    collect_ignore_glob = ["test_*.py"]

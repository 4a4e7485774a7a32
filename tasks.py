"""invoke entry point: `invoke --list` shows every task.

Each concern keeps its tasks in its own module under scripts/tasks/ (build, compile cache, test
matrix, board lab, provisioning, farm); this file only assembles them so a newcomer finds each
stage in one place.
"""

import sys

from provision.floor.exitcodes import INTERRUPTED

try:
    from invoke import Collection

    from scripts.tasks import bpu, build, farm, lab, matrix
    from scripts.tasks import provision as provision_tasks
    from scripts.tasks.cli import name_tasks
except KeyboardInterrupt:
    # Ctrl-C while the tasks load: invoke would exit 1 without a word
    print("invoke: interrupted while loading the tasks; nothing was run", file=sys.stderr)
    raise SystemExit(INTERRUPTED) from None  # as every task exits on Ctrl-C

ns = Collection()
for module in (build, bpu, matrix, lab, provision_tasks, farm):
    module.register(ns)
name_tasks(ns)

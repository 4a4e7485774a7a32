"""invoke entry point: `invoke --list` shows every task.

Each concern keeps its tasks in its own module (build, compile cache, test matrix, board lab,
provisioning); this file only assembles them so a newcomer finds each stage in one place.
"""

import sys

try:
    from invoke import Collection

    from provision import tasks as provision_tasks
    from scripts.tasks import bpu, build, farm, lab, matrix
    from scripts.tasks.cli import name_tasks
except KeyboardInterrupt:
    # Ctrl-C while the tasks load: invoke would exit 1 without a word
    print("invoke: interrupted while loading the tasks; nothing was run", file=sys.stderr)
    raise SystemExit(130) from None  # 128 + SIGINT, as every task exits on Ctrl-C

ns = Collection()
for module in (build, bpu, matrix, lab, provision_tasks, farm):
    module.register(ns)
name_tasks(ns)

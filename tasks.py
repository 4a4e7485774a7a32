"""invoke entry point: `invoke --list` shows every task.

Each concern keeps its tasks in its own module (build, compile cache, test matrix, board lab,
provisioning); this file only assembles them so a newcomer finds each stage in one place.
"""

from invoke import Collection

from provision import tasks as provision_tasks
from scripts.tasks import bpu, build, farm, lab, matrix

ns = Collection()
for module in (build, bpu, matrix, lab, provision_tasks, farm):
    module.register(ns)

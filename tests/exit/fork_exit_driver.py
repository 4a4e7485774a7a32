"""Run one exit case N times in forked children that each exit the normal way.

    python fork_exit_driver.py RUNS CODE  ->  prints one JSON line: [{"rc": .., "stderr": ..}, ..]

Importing torch costs ~2.5 CPU-seconds, so 100 fresh interpreters would dominate the lane. The
parent imports torch once (and nothing of torch_fl: the extension and the UCP library must load
fresh in every child), then forks. Each child runs CODE and then *falls off the end of this
script*: the interpreter finalises and the C runtime runs its exit handlers and library
destructors exactly as in any process exit, which is the teardown order under test. The parent
waits for each child and collects its exit status and stderr.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch  # noqa: F401 - imported once here, inherited by every child

assert "torch_fl" not in sys.modules, "torch_fl must load fresh in each child"

runs, code = int(sys.argv[1]), sys.argv[2]
results = []
is_child = False
for _ in range(runs):
    with tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:
            is_child = True
            os.dup2(err.fileno(), 2)
            sys.stderr = os.fdopen(2, "w", closefd=False)
            exec(compile(code, "<exit case>", "exec"), {"__name__": "__main__"})
            break  # leave the loop and the script: a normal interpreter exit
        _, status = os.waitpid(pid, 0)
        err.seek(0)
        results.append(
            {
                "rc": os.waitstatus_to_exitcode(status),
                "stderr": err.read().decode(errors="replace"),
            }
        )

if not is_child:
    print(json.dumps(results))

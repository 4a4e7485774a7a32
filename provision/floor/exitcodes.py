"""The exit codes every command of the tooling ends with, so a caller can tell the cases apart.

CI, a shell loop or a person reading `$?` learns what happened without parsing output. The
values are the shell's own conventions, not new ones: 2 is what argparse and most Unix tools
exit for a usage error, 124 is what timeout(1) exits for a command that ran too long, and a
process ended by signal N reports 128 + N.
"""

from __future__ import annotations

import signal

OK = 0
FAILED = 1  # the work ran and part of it failed (a provisioning step, a lane)
USAGE = 2  # bad input (a flag, a path, a config file), refused before anything changed
TIMED_OUT = 124  # a command ran past its timeout (provision.target reports it so)
INTERRUPTED = 128 + int(signal.SIGINT)  # 130: Ctrl-C, or SIGTERM turned into it (signals.py)

"""Ties a compiler process to the Python process that asked for it (standard library only).

  python watchdog.py WORK_DIR -- COMMAND...

Runs COMMAND in its own process group and exits with its status. The parent holds the write end
of this process's stdin and never writes: end-of-file means the parent is gone (Ctrl-C, SIGTERM,
kill -9, a crash) or has given up (a timeout, an interrupt it caught). Then the whole COMMAND
group is killed (emulator, guest Python and anything they started) and WORK_DIR is removed.
A parent-death signal could only reach the direct child and not clean up; the pipe reaches both.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading

KILLED = 137  # exit status when the parent went away: 128 + SIGKILL, like a killed command


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: watchdog.py WORK_DIR -- COMMAND...", file=sys.stderr)
        return 2
    work_dir, command = argv[1], argv[3:]
    # The parent is the only one allowed to stop us: a terminal's SIGINT goes to its group.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True)
    parent_gone = threading.Event()

    def watch_parent() -> None:
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        parent_gone.set()
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    threading.Thread(target=watch_parent, daemon=True).start()
    status = child.wait()
    try:
        os.killpg(child.pid, signal.SIGKILL)  # anything the compiler left running in its group
    except (ProcessLookupError, PermissionError):
        pass
    if parent_gone.is_set():
        shutil.rmtree(work_dir, ignore_errors=True)
        return KILLED
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""`invoke ship-cache`: the BPU artifact cache onto a board (over SSH) or into a directory.

A board is reached through the project's SSH target (provision/target.py), the same one
provisioning uses: host keys are checked against known_hosts (Fabric's default would accept any),
the port comes from `user@host:PORT`, and the identity, known_hosts and connect timeout come from
the provisioning configuration (`ssh:`). The cache is unpacked beside its final place and each
entry moved in whole, so an interrupted or doubled copy never leaves half an artifact.

    invoke ship-cache --dest root@board                 # into ~/.cache/torch-fl/bpu there
    invoke ship-cache --dest root@board:2222 --dir /data/bpu-cache
    invoke ship-cache --dest /mnt/board/home/root/.cache/torch-fl/bpu
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from invoke import task
from invoke.exceptions import Exit

from provision import cache_ship
from provision.floor import outpaths
from scripts.tasks.cache_paths import cache_root
from scripts.tasks.cli import CliTask, bad_flag

# `[user@]host[:port][:dir]`, IPv6 in brackets; a `:dir` part that is not all digits is a dir.
_BOARD_RE = re.compile(
    r"^(?P<host>(?:[A-Za-z0-9._-]+@)?(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+))"
    r"(?::(?P<port>\d+))?(?::(?P<dir>.+))?$"
)


@dataclass(frozen=True)
class BoardDest:
    """Where on a board: the SSH address (`user@host:port`) and the cache directory there."""

    address: str
    directory: str


def is_remote(dest: str) -> bool:
    """`user@host[...]` or `host:...`: an `@` or `:` before the first `/`, in a DEST that does
    not start like a path (`/backups/cache@2024` and `./a:b` are local directories)."""
    if dest.startswith(("/", ".", "~")):
        return False
    head = dest.split("/", 1)[0]
    return "@" in head or ":" in head


def parse_board(dest: str, directory: str | None) -> BoardDest:
    """`root@board:2222` is a port (it was once taken for a directory named 2222)."""
    match = _BOARD_RE.match(dest.strip())
    if not match:
        raise bad_flag("DEST", dest, "give user@host[:port] (IPv6: user@[::1]:22) or a directory")
    if match["dir"] and directory:
        raise bad_flag("--dir", directory, f"DEST {dest!r} names a directory already; keep one")
    port = match["port"] or "22"
    return BoardDest(f"{match['host']}:{port}", directory or match["dir"] or cache_ship.BOARD_CACHE)


def _local_dest(dest: str) -> Path:
    local = Path(dest).expanduser()
    problem = outpaths.lookup_problem(local)
    if problem is None and local.exists() and not local.is_dir():
        problem = "is a file; give a directory (or user@host[:port])"
    problem = problem or outpaths.dir_problem(local)
    if problem:
        raise bad_flag("DEST", dest, problem)
    return local


@task(
    klass=CliTask,
    help={
        "dest": "user@host[:port] (a board, over SSH) or a local directory",
        "dir": f"the cache directory on the board (default {cache_ship.BOARD_CACHE})",
        "cache_dir": "cache root",
        "insecure_host_key": "accept a board whose host key is not in known_hosts (test boards)",
    },
)
def ship_cache(c, dest, dir=None, cache_dir=None, insecure_host_key=False):
    """Copy the artifact cache (artifacts + index) to a board, where the same keys hit."""
    if not dest.strip():
        # Path("") is the current directory: an empty value must never unpack the cache here
        raise bad_flag("DEST", dest, "give user@host[:port] or a local directory")
    if dir is not None and not dir.strip():
        raise bad_flag("--dir", dir, "give the directory on the board (or leave the flag out)")
    board = parse_board(dest, dir) if is_remote(dest) else None
    if board is None and dir is not None:
        raise bad_flag("--dir", dir, "is for a board; a local DEST is the directory itself")
    local = _local_dest(dest) if board is None else None
    root = cache_root(cache_dir)
    if not (root / "artifacts").is_dir():
        raise SystemExit(f"nothing to ship: {root}/artifacts does not exist")
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "bpu-cache.tar.gz"
        cache_ship.write_bundle(root, bundle)
        if board is not None:
            ship_to_board(board, bundle, insecure_host_key=insecure_host_key)
        else:
            assert local is not None
            _unpack_whole(bundle, local)
    where = f"{board.address}:{board.directory}" if board else dest
    print(f"shipped {root} -> {where}")


def ship_to_board(board: BoardDest, bundle: Path, *, insecure_host_key: bool = False) -> None:
    """Copy `bundle` to the board and unpack it there, through provisioning's SSH target."""
    from provision import config
    from provision.multihost import HostJob, open_target
    from provision.target import TargetError, parse_host

    try:
        cfg = config.load()
    except config.ConfigError as exc:
        raise Exit(f"ship-cache: {exc}", code=2) from None
    target = None
    try:
        target = open_target(HostJob(parse_host(board.address)), cfg, insecure_host_key)
        cache_ship.ship_bundle(target, bundle, board.directory)
    except (TargetError, ValueError, OSError) as exc:
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise Exit(f"ship-cache: {detail}", code=1) from None
    finally:
        if target is not None:
            target.close()


def _unpack_whole(bundle: Path, dest: Path) -> None:
    """Unpack into a staging directory inside `dest`, then move each artifact and index file
    into place with a rename: a copy interrupted (Ctrl-C) or run twice at once never leaves a
    half-written entry where the cache would read it."""
    dest.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".ship-", dir=dest))
    try:
        with tarfile.open(bundle) as tar:
            tar.extractall(staging / "new", filter="data")
        for sub in ("artifacts", "index"):
            if not (staging / "new" / sub).is_dir():
                continue
            (dest / sub).mkdir(exist_ok=True)
            for entry in sorted((staging / "new" / sub).iterdir()):
                _move_into_place(entry, dest / sub / entry.name, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _move_into_place(entry: Path, final: Path, staging: Path) -> None:
    """Rename `entry` to `final`. An entry already there (the same key: the same content) is
    first renamed aside into `staging`, never merged file by file; a second copy running at
    the same time may put its own in between, hence the retries."""
    for attempt in range(5):
        try:
            os.replace(entry, final)
            return
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.EISDIR, errno.ENOTDIR):
                raise
        with contextlib.suppress(FileNotFoundError):
            os.replace(final, staging / f"old-{final.parent.name}-{final.name}-{attempt}")
    os.replace(entry, final)

"""The BPU artifact cache onto a target: one tarball, unpacked there entry by entry.

Used by `invoke ship-cache` and by `farm.test --ship-cache`, over any provisioning Target. The
tarball is unpacked beside the cache and each artifact (and index file) moved into place whole,
so a copy interrupted or run twice at once never leaves half an entry where the board's cache
would read it.
"""

from __future__ import annotations

import os
import secrets
import shlex
import tarfile
from pathlib import Path

from provision.target import Target, TargetError

BOARD_CACHE = "~/.cache/torch-fl/bpu"  # FLAGOS_BPU_CACHE's default on a board
PARTS = ("artifacts", "index")


def write_bundle(cache_root: Path, bundle: Path) -> Path:
    """The cache's artifacts and index as one .tar.gz (what a board needs for the same keys)."""
    bundle.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(bundle, "w:gz") as tar:
        for sub in PARTS:
            if (cache_root / sub).is_dir():
                tar.add(cache_root / sub, arcname=sub)
    return bundle


def ship_bundle(target: Target, bundle: Path, directory: str = BOARD_CACHE) -> None:
    """Copy `bundle` to the target and unpack it into `directory` there (TargetError if not)."""
    tarball = f"/tmp/bpu-cache-{os.getpid()}-{secrets.token_hex(4)}.tar.gz"
    target.put(bundle, tarball)
    rc, out, err = target.run(remote_unpack_script(directory, tarball), timeout=600)
    if rc != 0:
        raise TargetError(f"unpacking the BPU cache failed (rc {rc}): {(err or out).strip()}")


def remote_unpack_script(remote_dir: str, tarball: str) -> str:
    """The sh script that unpacks `tarball` into `remote_dir` on the board the way
    _unpack_whole does here: beside first, then each entry moved in whole."""
    # Quoted for the remote shell (a directory may hold spaces or `;`); `~/` kept as $HOME.
    where = shlex.quote(remote_dir)
    if remote_dir == "~" or remote_dir.startswith("~/"):
        where = '"$HOME"' + shlex.quote(remote_dir[1:]) if remote_dir != "~" else '"$HOME"'
    tar = shlex.quote(tarball)
    return (
        f'set -e; d={where}; mkdir -p "$d"; t="$d/.ship-$$"; mkdir -p "$t"; '
        f"trap 'rm -rf \"$t\" {tar}' EXIT; "
        f'tar -xzf {tar} -C "$t"; '
        'for sub in artifacts index; do [ -d "$t/$sub" ] || continue; mkdir -p "$d/$sub"; '
        'for e in "$t/$sub"/* "$t/$sub"/.[!.]*; do [ -e "$e" ] || continue; n="${e##*/}"; '
        # mv into an existing directory would nest; move the old entry aside first
        'if [ -d "$d/$sub/$n" ]; then mv "$d/$sub/$n" "$t/old-$sub-$n"; fi; '
        'mv "$e" "$d/$sub/$n"; done; done'
    )

"""Pinned downloads: found in --artifacts or fetched here, verified by sha256, shipped to the target.

Downloads happen on the controller so an offline board needs nothing but SSH; the sha256 is
checked again on the target after the copy.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from provision.context import Context
from provision.download import DownloadError, download
from provision.floor import light
from provision.results import StepError
from provision.settings import Pin

atomic = light.load("atomic")


sha256_of = atomic.sha256_file


def locate(ctx: Context, pin: Pin) -> Path | None:
    """The pinned file in --artifacts, if present (verified)."""
    if ctx.options.artifacts is None:
        return None
    candidate = ctx.options.artifacts / pin.filename
    if not candidate.is_file():
        return None
    actual = sha256_of(candidate)
    if actual != pin.sha256:
        raise StepError(
            f"{candidate} has sha256 {actual}, expected {pin.sha256}; replace the file "
            "with the pinned one (or update the pin in your --config)"
        )
    return candidate


def fetch(ctx: Context, pin: Pin) -> Path:
    """--artifacts first, then the download cache, then the network; always sha256-checked."""
    found = locate(ctx, pin)
    if found is not None:
        return found
    cache = ctx.work_dir / "downloads"
    cache.mkdir(parents=True, exist_ok=True)
    dest = cache / pin.filename
    if dest.is_file() and sha256_of(dest) == pin.sha256:
        return dest
    # Resumed and retried; only a complete download with the pinned sha256 gets the final name.
    ctx.echo(f"  downloading {pin.url}")
    try:
        return download(pin.url, dest, pin.sha256, echo=ctx.echo)
    except DownloadError as exc:
        raise StepError(
            f"{exc}; on an offline machine put {pin.filename} into a directory and pass "
            "--artifacts DIR"
        ) from exc


def ship(ctx: Context, local: Path, remote_dir: str, sha256: str | None = None) -> str:
    """Copy to the target and verify the sha256 there; return the remote path."""
    remote = f"{remote_dir}/{local.name}"
    ctx.target.put(local, remote)
    expected = sha256 or sha256_of(local)
    rc, out, err = ctx.sh(f"sha256sum {shlex.quote(remote)}", timeout=300)
    if rc != 0 or out.split()[:1] != [expected]:
        raise StepError(
            f"{remote} on {ctx.target.name} does not match sha256 {expected} after copying "
            f"({(out or err).strip()[:200]}); check disk space on the target"
        )
    ctx.recorded_artifacts.append({"name": local.name, "sha256": expected})
    return remote

"""One pinned download over HTTP(S): resumed where it stopped, retried, sha256-checked.

A board's link drops; a 100 MB tarball should not start over, and one reset should not fail
the step. The bytes go to `<dest>.part`, which survives between attempts and between runs;
each attempt asks for the rest with an HTTP Range request (a server that ignores it sends the
whole file again, which starts the part over). Only a complete file whose sha256 is the pinned
one is renamed to `dest` (atomically), so `dest` is always whole and right. A mismatch deletes
the part: resuming onto bad bytes could never succeed.
"""

from __future__ import annotations

import hashlib
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from http.client import HTTPException
from pathlib import Path

ATTEMPTS = 4
BACKOFF_S = 1.0  # doubled after each failed attempt
CHUNK = 1 << 20


class DownloadError(Exception):
    """The download failed after every attempt, or its sha256 is not the pinned one."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def _attempt(url: str, part: Path, timeout: float, echo: Callable[[str], None]) -> None:
    """Append the rest of `url` to `part` (or rewrite it when the server sends it whole)."""
    have = part.stat().st_size if part.is_file() else 0
    request = urllib.request.Request(url)
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        resp = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # nothing left to send: the part is complete
            return
        raise
    with resp:
        resumed = have and resp.status == 206
        if have and not resumed:
            echo("  ... the server sent the whole file again; starting over")
        length = resp.headers.get("Content-Length")
        expected = int(length) if length and length.isdigit() else None
        written = 0
        with open(part, "ab" if resumed else "wb") as out:
            while chunk := resp.read(CHUNK):
                out.write(chunk)
                written += len(chunk)
                total = (have if resumed else 0) + written
                if total % (16 << 20) < len(chunk):
                    echo(f"  ... {total >> 20} MB")
        if expected is not None and written < expected:
            raise OSError(f"connection closed after {written} of {expected} bytes")


def download(
    url: str,
    dest: Path,
    sha256: str,
    echo: Callable[[str], None] = lambda _line: None,
    attempts: int = ATTEMPTS,
    timeout: float = 60.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Path:
    """`url` into `dest`, whose sha256 must be `sha256`; resumes `<dest>.part` if present."""
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    delay = BACKOFF_S
    last: Exception | None = None
    for attempt in range(1, attempts + 1):
        try:
            _attempt(url, part, timeout, echo)
            last = None
            break
        except (OSError, HTTPException) as exc:  # URLError, timeouts, resets, short reads
            last = exc
            if isinstance(exc, urllib.error.HTTPError) and 400 <= exc.code < 500:
                break  # not found, forbidden: asking again will not help
            if attempt < attempts:
                kept = part.stat().st_size if part.is_file() else 0
                echo(f"  ... attempt {attempt} failed ({exc}); retrying in {delay:g}s "
                     f"from byte {kept}")  # fmt: skip
                sleep(delay)
                delay *= 2
    if last is not None:
        raise DownloadError(f"downloading {url} failed after {attempt} attempt(s): {last}")
    actual = _sha256(part)
    if actual != sha256:
        part.unlink(missing_ok=True)
        raise DownloadError(
            f"{url} has sha256 {actual}, expected {sha256}: refusing it (the upstream file "
            "changed or the download was tampered with)"
        )
    os.replace(part, dest)
    return dest

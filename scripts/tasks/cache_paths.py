"""Where the BPU artifact cache is, read without torch: the cache tasks answer in under a second."""

from __future__ import annotations

import os
from pathlib import Path

from provision.floor import light, outpaths
from scripts.tasks.cli import bad_flag


def cache_root(cache_dir: str | None) -> Path:
    if cache_dir is not None:
        # An empty value must not fall back to the default cache (which clean would empty).
        if not cache_dir.strip():
            raise bad_flag("--cache-dir", cache_dir, "give a directory (or leave the flag out)")
        return checked_cache_dir("--cache-dir", cache_dir, Path(cache_dir).expanduser())
    # settings.resolve().cache_dir, read the light way (the env file reader and the default are
    # the same modules resolve() uses): the cache tasks must not wait for torch to import
    raw, _where = light.load("envfile").lookup("FLAGOS_BPU_CACHE")
    if raw and raw.strip():
        path = Path(os.path.abspath(os.path.expanduser(raw)))
        return checked_cache_dir("FLAGOS_BPU_CACHE", raw, path)
    return Path(light.load("bpu.cache_listing").default_cache_dir())


def checked_cache_dir(source: str, value: str, path: Path) -> Path:
    problem = outpaths.lookup_problem(path)
    if problem is None and path.exists() and not path.is_dir():
        problem = "is a file; give the cache directory"
    if problem:
        raise bad_flag(source, value, problem)
    return path

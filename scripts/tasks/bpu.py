"""invoke tasks for the bpu compile backend: the artifact cache, x86-host compile, shipping.

invoke cache.list [--json FILE|-] | cache.clean [--older-than-days N]
invoke compile-host --model tests.support.models:ResNet18 --shape 1,3,224,224 [--calibration F]
invoke ship-cache --dest user@board[:port] [--dir DIR] | --dest /local/dir (scripts/tasks/ship.py)
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import re
import shutil
import sys
from pathlib import Path

from invoke import Collection, task
from invoke.exceptions import Exit

from provision.floor import light, outpaths
from scripts.tasks import ship
from scripts.tasks.cache_paths import cache_root
from scripts.tasks.cli import (
    INTERRUPTED_CODE,
    CliTask,
    bad_flag,
    check_output_file,
    number_flag,
    print_lines,
    write_json,
)

# What the cache itself writes under index/ (`<graph key>.json`, and the atomic writer's
# `.<name>.<pid>.<hex>.tmp`) and under artifacts/ while discarding (`.trash-<key>-<pid>-<ns>`).
_INDEX_FILE = re.compile(r"[0-9a-f]{64}\.json|\.[0-9a-f]{64}\.json\.\d+\.[0-9a-f]+\.tmp")
_TRASH = re.compile(r"\.trash-[0-9a-f]{64}-(\d+)-\d+")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return pid > 0
    return True


def _sweep(root: Path, index_too: bool) -> None:
    """Remove what an interrupted clean left (trash of dead processes) and, when everything was
    cleaned, the index files; never a file the cache did not write (`--cache-dir ~` keeps
    ~/index/notes.txt)."""
    artifacts = root / "artifacts"
    for entry in artifacts.iterdir() if artifacts.is_dir() else []:
        match = _TRASH.fullmatch(entry.name)
        if match and not _alive(int(match.group(1))) and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
    index = root / "index"
    if index_too and index.is_dir() and not index.is_symlink():
        for entry in index.iterdir():
            if _INDEX_FILE.fullmatch(entry.name) and entry.is_file():
                entry.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            index.rmdir()  # only when nothing else is in it


@task(
    klass=CliTask,
    help={
        "cache_dir": "cache root (default $FLAGOS_BPU_CACHE)",
        "json": "write the entries as JSON to this file, or - for standard output",
    },
)
def cache_list(c, cache_dir=None, json=None):
    """List cached BPU artifacts."""
    check_output_file("--json", json)
    # the standard-library listing, loaded without torch (cache.list answers in well under 1 s)
    entries = light.load("bpu.cache_listing").list_entries(cache_root(cache_dir))
    if json is not None:
        write_json(entries, json)
        return
    lines = [f"{len(entries)} artifact(s) in {cache_root(cache_dir)}"]
    if entries:
        lines.append(f"  {'key':<16}  {'bytes':>12}  {'march':<8} {'compiler':<24} files")
    for e in entries:
        flag = "  CORRUPT" if e["corrupt"] else ""
        lines.append(f"  {e['key'][:16]}  {e['size']:>12}  {str(e['march']):<8} "
                     f"{str(e['compiler']):<24} {','.join(e['files'])}{flag}")  # fmt: skip
    print_lines(lines)


@task(
    klass=CliTask,
    help={
        "older_than_days": "only entries older than this many days (a number >= 0)",
        "cache_dir": "cache root",
    },
)
def cache_clean(c, older_than_days=None, cache_dir=None):
    """Remove cached BPU artifacts (all, or older than N days)."""
    days = number_flag("--older-than-days", older_than_days, minimum=0.0)
    root = cache_root(cache_dir)
    if not (root / "artifacts").is_dir():
        # Not a cache (or an empty one): ArtifactCache.clean would still remove ROOT/index.
        print(f"removed 0 artifact(s) (no artifacts/ in {root})")
        return
    listing = light.load("bpu.cache_listing")
    before = len(listing.list_entries(root))
    try:
        from torch_fl.bpu.cache import ArtifactCache

        # -inf, not None: None also deletes ROOT/index wholesale; _sweep removes only the
        # index files the cache wrote. (-inf rather than 0: an entry stamped in the future by
        # a skewed clock is still older than "now minus nothing".)
        older = days * 86400 if days is not None else -math.inf
        removed = ArtifactCache(root).clean(older)
        _sweep(root, index_too=days is None)
    except KeyboardInterrupt:
        left = len(listing.list_entries(root))
        print(
            f"cache.clean: interrupted; removed {max(before - left, 0)} of {before} artifact(s), "
            "each one whole (the rest are intact); run it again to finish",
            file=sys.stderr,
        )
        raise Exit(code=INTERRUPTED_CODE) from None
    print(f"removed {removed} artifact(s)")


_MODEL_SPEC = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*")
MAX_INPUT_ELEMENTS = 2**31 - 1


def _parse_shape(shape: str) -> list[int]:
    try:
        dims = [int(s) for s in shape.split(",")]
    except ValueError:
        dims = []
    if not dims or any(d < 1 for d in dims) or math.prod(dims) > MAX_INPUT_ELEMENTS:
        raise bad_flag(
            "--shape", shape, "give the input shape as whole numbers >= 1 separated by commas "
            f"(e.g. 1,3,224,224), at most {MAX_INPUT_ELEMENTS} elements in all",
        )  # fmt: skip
    return dims


def _input_file(flag: str, value: str | None) -> str | None:
    """A file the task reads: it must exist and be a regular file (a FIFO would hang the read)."""
    if value is None:
        return None
    path = Path(value).expanduser()
    problem = outpaths.lookup_problem(path) if value.strip() else "is empty; give a file path"
    if problem is None and not path.is_file():
        problem = "is a directory" if path.is_dir() else "is not a regular file"
        problem = problem if path.exists() else "does not exist"
        problem += "; give the file (or leave the flag out)"
    if problem:
        raise bad_flag(flag, value, problem)
    return str(path)


def _load_model(spec: str):
    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise bad_flag("MODEL", spec, f"cannot be loaded ({exc})") from None
    return factory()


@task(
    klass=CliTask,
    help={
        "model": "module:callable returning an nn.Module (e.g. tests.support.models:ResNet18)",
        "shape": "input shape, comma separated (default 1,3,224,224)",
        "calibration": "calibration JSON from torch_fl.bpu.calibrate(...).save()",
        "march": "BPU march (default $FLAGOS_BPU_MARCH or nash-e)",
        "state_dict": "optional .pt state dict to load into the model",
    },
)
def compile_host(c, model, shape="1,3,224,224", calibration=None, march=None, state_dict=None):
    """Compile a model's partitions to .hbm artifacts with native hbdk4 (x86_64 host)."""
    # Every value is checked before torch imports (seconds) and before the compiler is looked for.
    if not _MODEL_SPEC.fullmatch(model.strip()):
        raise bad_flag("MODEL", model, "give module:callable (e.g. tests.support.models:ResNet18)")
    model = model.strip()
    dims = _parse_shape(shape)
    calibration = _input_file("--calibration", calibration)
    state_dict = _input_file("--state-dict", state_dict)
    marches = light.load("targets").MARCHES
    if march is not None and march not in marches:
        raise bad_flag("--march", march, f"use one of {', '.join(marches)} (or leave the flag out)")
    import torch

    from torch_fl.bpu import drivers, report

    info = drivers.discover(refresh=True)
    if info.kind != "native":
        raise SystemExit(
            f"compile-host needs a native hbdk4 (found {info.kind}: {info.detail}). Install the "
            "OE hbdk4 wheels into this Python or set FLAGOS_BPU_X86_PYTHON."
        )
    net = _load_model(model).eval()
    if state_dict:
        net.load_state_dict(torch.load(state_dict, map_location="cpu"))
    options = {"executor": "eager", "compile_artifact": "always"}
    if calibration:
        options["calibration"] = calibration
    if march:
        options["march"] = march
    x = torch.randn(*dims)
    with report.collect() as reps, torch.no_grad():
        torch.compile(net, backend="bpu", options=options, dynamic=False)(x)
    for g in reps:
        for rt in g.runtimes:
            b = rt.last_build
            print(f"partition {rt.spec.index}: key {b.artifact.key[:16]} compiled={b.compiled}")
    print(f"artifacts in {cache_root(None)}; ship them with `invoke ship-cache --dest ...`")


def register(ns: Collection) -> None:
    """Add `cache` (list/clean), `compile-host` and `ship-cache` to the root collection."""
    cache = Collection("cache")
    cache.add_task(cache_list, name="list")
    cache.add_task(cache_clean, name="clean")
    ns.add_collection(cache)
    ns.add_task(compile_host, name="compile-host")
    ns.add_task(ship.ship_cache, name="ship-cache")

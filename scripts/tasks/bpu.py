"""invoke tasks for the bpu compile backend: the artifact cache, x86-host compile, shipping.

invoke cache.list [--json FILE|-] | cache.clean [--older-than-days N]
invoke compile-host --model tests.compile.models:ResNet18 --shape 1,3,224,224 [--calibration F]
invoke ship-cache --dest user@board[:DIR] | --dest /local/dir
"""

from __future__ import annotations

import importlib
import os
import tarfile
import tempfile
from pathlib import Path

from invoke import Collection, task

from provision import light
from scripts.tasks.cli import (
    CliTask,
    bad_flag,
    check_output_file,
    number_flag,
    print_lines,
    write_json,
)


def _cache_root(cache_dir: str | None) -> Path:
    if cache_dir is not None:
        # An empty value must not fall back to the default cache (which clean would empty).
        if not cache_dir.strip():
            raise bad_flag("--cache-dir", cache_dir, "give a directory (or leave the flag out)")
        path = Path(cache_dir).expanduser()
        if path.exists() and not path.is_dir():
            raise bad_flag("--cache-dir", cache_dir, "is a file; give the cache directory")
        return path
    # settings.resolve().cache_dir, read the light way (the env file reader and the default are
    # the same modules resolve() uses): the cache tasks must not wait for torch to import
    raw, _where = light.load("envfile").lookup("FLAGOS_BPU_CACHE")
    if raw and raw.strip():
        return Path(os.path.abspath(os.path.expanduser(raw)))
    return Path(light.load("bpu.cache_listing").default_cache_dir())


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
    entries = light.load("bpu.cache_listing").list_entries(_cache_root(cache_dir))
    if json is not None:
        write_json(entries, json)
        return
    lines = [f"{len(entries)} artifact(s) in {_cache_root(cache_dir)}"]
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
    root = _cache_root(cache_dir)
    from torch_fl.bpu.cache import ArtifactCache

    older = days * 86400 if days is not None else None
    removed = ArtifactCache(root).clean(older)
    print(f"removed {removed} artifact(s)")


def _load_model(spec: str):
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise SystemExit(f"--model must be module:callable (e.g. models:ResNet18), got {spec!r}")
    return getattr(importlib.import_module(module_name), attr)()


@task(
    klass=CliTask,
    help={
        "model": "module:callable returning an nn.Module (e.g. tests.compile.models:ResNet18)",
        "shape": "input shape, comma separated (default 1,3,224,224)",
        "calibration": "calibration JSON from torch_fl.bpu.calibrate(...).save()",
        "march": "BPU march (default $FLAGOS_BPU_MARCH or nash-e)",
        "state_dict": "optional .pt state dict to load into the model",
    },
)
def compile_host(c, model, shape="1,3,224,224", calibration=None, march=None, state_dict=None):
    """Compile a model's partitions to .hbm artifacts with native hbdk4 (x86_64 host)."""
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
    x = torch.randn(*[int(s) for s in shape.split(",")])
    with report.collect() as reps, torch.no_grad():
        torch.compile(net, backend="bpu", options=options, dynamic=False)(x)
    for g in reps:
        for rt in g.runtimes:
            b = rt.last_build
            print(f"partition {rt.spec.index}: key {b.artifact.key[:16]} compiled={b.compiled}")
    print(f"artifacts in {_cache_root(None)}; ship them with `invoke ship-cache --dest ...`")


@task(
    klass=CliTask,
    help={"dest": "user@host[:dir] (ssh) or a local directory", "cache_dir": "cache root"},
)
def ship_cache(c, dest, cache_dir=None):
    """Copy the artifact cache (artifacts + index) to a board, where the same keys hit."""
    if not dest.strip():
        # Path("") is the current directory: an empty value must never unpack the cache here
        raise bad_flag("DEST", dest, "give user@host[:dir] or a local directory")
    if not ("@" in dest or ":" in dest) and Path(dest).exists() and not Path(dest).is_dir():
        raise bad_flag("DEST", dest, "is a file; give a directory (or user@host[:dir])")
    root = _cache_root(cache_dir)
    if not (root / "artifacts").is_dir():
        raise SystemExit(f"nothing to ship: {root}/artifacts does not exist")
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "bpu-cache.tar.gz"
        with tarfile.open(bundle, "w:gz") as tar:
            for sub in ("artifacts", "index"):
                if (root / sub).is_dir():
                    tar.add(root / sub, arcname=sub)
        if "@" in dest or (":" in dest and not os.path.isabs(dest)):
            from fabric import Connection

            host, _, remote_dir = dest.partition(":")
            remote_dir = remote_dir or "~/.cache/torch-fl/bpu"
            conn = Connection(host)
            conn.run(f"mkdir -p {remote_dir}")
            conn.put(str(bundle), "/tmp/bpu-cache.tar.gz")
            conn.run(f"tar -xzf /tmp/bpu-cache.tar.gz -C {remote_dir} && rm /tmp/bpu-cache.tar.gz")
        else:
            Path(dest).mkdir(parents=True, exist_ok=True)
            with tarfile.open(bundle) as tar:
                tar.extractall(dest, filter="data")
    print(f"shipped {root} -> {dest}")


def register(ns: Collection) -> None:
    """Add `cache` (list/clean), `compile-host` and `ship-cache` to the root collection."""
    cache = Collection("cache")
    cache.add_task(cache_list, name="list")
    cache.add_task(cache_clean, name="clean")
    ns.add_collection(cache)
    ns.add_task(compile_host, name="compile-host")
    ns.add_task(ship_cache, name="ship-cache")

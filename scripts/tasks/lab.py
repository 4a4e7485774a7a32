"""invoke lab.up / lab.status / lab.ssh / lab.down / lab.clean: the emulated board lab.

See docs/board-lab.md. Products (kernel, root file system) are cached outside the repository;
`lab.clean` removes them.
"""

from __future__ import annotations

import os
import sys

from invoke import Collection, task
from invoke.exceptions import Exit

from scripts.tasks.cli import (
    CliTask,
    bad_flag,
    check_output_file,
    heartbeat,
    print_lines,
    split_names,
    write_json,
)


@task(
    klass=CliTask,
    help={
        "page_size": "guest kernel page size: 64k (built from Debian's source) or 16k",
        "image": "root file system: board (trixie, box64 to upgrade; default) or torch (sid, "
        "Debian's torch and a compiler: torch-fl built and tested there)",
    },
)
def up(c, page_size=None, image=None):
    """Start the emulated board (building and caching its kernel and rootfs when missing)."""
    from scripts import lab
    from scripts.lab import images, vm

    if page_size is not None and not page_size.strip():
        # "$UNSET" is a mistake, not "the default": the default starts a build of many minutes
        raise bad_flag("--page-size", page_size, "use 64k or 16k (or leave the flag out)")
    if image is not None and image not in images.IMAGES:
        raise bad_flag("--image", image, f"use one of {', '.join(sorted(images.IMAGES))}")
    page_size = page_size or lab.DEFAULT_PAGE_SIZE
    image = image or images.DEFAULT
    ok, why = lab.capability(page_size, image)
    if not ok:
        raise Exit(f"lab.up: the lab cannot start here: {why}", code=2)
    try:
        # A cold start builds the kernel and the rootfs side by side for many minutes.
        with heartbeat(f"lab.up {page_size} {image}"):
            info, timings = vm.up(page_size, image_name=image)
    except Exception as exc:  # noqa: BLE001 - report any build/boot failure with its message
        raise Exit(f"lab.up: {exc}", code=1) from exc
    print(f"lab up ({info.page_size} pages, {info.image} image), pid {info.pid}: ssh {info.host}")
    print(f"  timings: {timings}")
    print(
        f"  provision: invoke provision --host {info.host} --config <yaml with ssh.known_hosts: "
        f"{info.known_hosts}, ssh.identity: {info.identity}>"
    )


@task(
    klass=CliTask,
    iterable=["image"],
    help={
        "page_size": "guest kernel page size: 64k (default) or 16k",
        "image": "root file system image(s) to build (repeatable or a comma list; default all)",
    },
)
def build(c, page_size=None, image=None):
    """Build and cache the lab's products (kernel, images) side by side, booting nothing."""
    from concurrent.futures import ThreadPoolExecutor

    from scripts import lab
    from scripts.lab import images, kernel, rootfs

    if page_size is not None and not page_size.strip():
        raise bad_flag("--page-size", page_size, "use 64k or 16k (or leave the flag out)")
    page_size = page_size or lab.DEFAULT_PAGE_SIZE
    names = split_names(image)
    if image and not names:  # `--image "$UNSET"`: a mistake, never "every image"
        raise bad_flag("--image", ",".join(image), f"use {', '.join(sorted(images.IMAGES))}")
    names = names or sorted(images.IMAGES)
    unknown = [n for n in names if n not in images.IMAGES]
    if unknown:
        raise bad_flag("--image", ",".join(unknown), f"use {', '.join(sorted(images.IMAGES))}")
    for name in names:
        ok, why = lab.capability(page_size, name)
        if not ok:
            raise Exit(f"lab.build: the lab cannot be built here: {why}", code=2)
    # The kernel's `make -j2` keeps both cores busy, mmdebstrap under qemu-user mostly waits on
    # one emulated dpkg at a time: all of them at once fill the cores (docs/board-lab.md).
    jobs = {"kernel": (kernel.ensure, page_size)}
    jobs.update({f"rootfs {n}": (rootfs.ensure, n) for n in names})
    try:
        with heartbeat(f"lab.build {page_size} {','.join(names)}"):
            with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="lab-build") as pool:
                futures = {what: pool.submit(fn, arg) for what, (fn, arg) in jobs.items()}
                done = {what: future.result() for what, future in futures.items()}
    except Exception as exc:  # noqa: BLE001 - report any build failure with its message
        raise Exit(f"lab.build: {exc}", code=1) from exc
    for what, (path, built) in done.items():
        print(f"{what}: {'built' if built else 'cached'} {path}")


@task(
    klass=CliTask,
    help={"json": "write the status as JSON to this file, or - for standard output"},
)
def status(c, json=None):
    """Show whether a lab is running, its port, and what the guest reports."""
    from provision.target import TargetError
    from scripts.lab import cache, vm

    check_output_file("--json", json)
    info = vm.running()
    doc: dict = {"cache": str(cache.cache_root()), "products": {}, "running": info is not None}
    for entry in sorted(cache.cache_root().glob("*-*")) if cache.cache_root().is_dir() else []:
        if (entry / cache.DONE_MARKER).is_file():
            doc["products"][entry.name] = {"build_s": cache.metadata(entry).get("build_s")}
    if info is not None:
        doc.update(
            pid=info.pid,
            host=info.host,
            page_size=info.page_size,
            image=info.image,
            known_hosts=str(info.known_hosts),
            identity=str(info.identity),
        )
        try:
            board = vm.target(info)
        except TargetError as exc:
            doc["guest"] = None
            doc["guest_error"] = str(exc)
        else:
            try:
                _, out, err = board.run("uname -m; getconf PAGESIZE; uname -r", timeout=30)
            finally:
                board.close()
            doc["guest"] = " ".join(out.split()) or err.strip()
    if json is not None:
        write_json(doc, json)
        return
    lines = [f"cache: {doc['cache']}"]
    lines += [f"  {name}: {p['build_s'] or '?'} s to build" for name, p in doc["products"].items()]
    if info is None:
        print_lines([*lines, "lab: not running"])
        return
    lines.append(
        f"lab: running, pid {info.pid}, {info.host}, page size {info.page_size}, {info.image} image"
    )
    guest = doc.get("guest") or f"does not answer ({doc.get('guest_error')})"
    lines.append(f"  guest: {guest}")
    lines.append(f"  known_hosts {info.known_hosts}, identity {info.identity}")
    print_lines(lines)


@task(klass=CliTask, help={"command": "run this command instead of an interactive shell"})
def ssh(c, command=None):
    """Open a shell (or run a command) on the running lab."""
    from scripts.lab import vm

    info = vm.running()
    if info is None:
        raise Exit("lab.ssh: no lab is running; start one with `invoke lab.up`", code=2)
    argv = info.ssh_argv(batch=command is not None)
    if command is not None:
        argv.append(command)
    sys.stdout.flush()
    os.execvp(argv[0], argv)


@task(klass=CliTask)
def down(c):
    """Stop the running lab (by its recorded PID)."""
    from scripts.lab import vm

    print("lab stopped" if vm.down() else "lab: not running")


@task(klass=CliTask)
def clean(c):
    """Stop the lab and remove every cached lab product (kernels, root file systems)."""
    from scripts.lab import cache, vm

    vm.down()
    removed, kept = cache.clean()
    for path in removed:
        print(f"removed {path}")
    for path in kept:
        print(f"kept {path}: not something the lab cache wrote")


def register(ns: Collection) -> None:
    """Add the `lab` collection to the root collection."""
    ns.add_collection(Collection("lab", up, build, status, ssh, down, clean))

"""invoke farm.provision / farm.test: provision and test boards held through labgrid.

See docs/farm.md. labgrid finds and holds the boards; provisioning and lanes go over this
project's own SSH target with host keys checked. Exit 0 only when every requested place (and
lane) passed; 1 otherwise; 2 for bad input.
"""

from __future__ import annotations

from pathlib import Path

from invoke import Collection, task
from invoke.exceptions import Exit

from provision.floor import exitcodes, outpaths
from scripts.tasks.cli import CliTask, bad_flag, number_flag

ROOT = Path(__file__).resolve().parents[2]


_COMMON_HELP = {
    "coordinator": "labgrid coordinator HOST:PORT (else LG_COORDINATOR, else invoke.yaml farm.coordinator)",
    "place": "a place by name (repeatable or a comma list)",
    "tag": "a tag filter key=value (repeatable), e.g. --tag board=rdk-s600 --tag pagesize=65536",
    "count": "with tag filters: how many matching places to hold (default 1)",
    "farm-config": "YAML with coordinator, ssh and per-place ssh settings (docs/farm.md)",
    "config": "provisioning YAML (as for invoke provision --config)",
    "only": "provisioning steps to run (comma list)",
    "skip": "provisioning steps to skip (comma list)",
    "artifacts": "directory with pinned tarballs/probe for offline boards",
    "insecure-host-key": "accept unknown SSH host keys (throwaway test boards only)",
    "reserve-timeout": "seconds to wait for a free place before giving up (default 300)",
    "out": "report directory (default out/farm)",
    "boot-timeout": "seconds a power-cycled board gets to answer on SSH (default 300)",
}


def _seconds(flag: str, value: str | None, default: float) -> float:
    """A finite number of seconds > 0 (NaN would never expire; 0 or -5 are typos)."""
    if value is None:
        return default
    seconds = number_flag(flag, value, minimum=0.0)
    if not seconds:
        raise bad_flag(flag, value, "use a number of seconds > 0")
    return seconds


def _job(c, *, mode, coordinator, place, tag, count, farm_config, config, only, skip,
         artifacts, insecure_host_key, reserve_timeout, out, boot_timeout=None,
         **extra):  # fmt: skip
    from provision import config as config_mod
    from provision import run_inputs, scratch
    from provision.steps import Options
    from scripts.farm import selection, settings
    from scripts.farm.run import FarmJob

    try:
        for flag, items in (("--place", place), ("--tag", tag)):
            # "$UNSET" among other values would be dropped unseen; alone it selects nothing
            for item in items or []:
                if not str(item).strip():
                    raise ValueError(
                        f"{flag} {item!r} is empty; give a value or leave the flag out"
                    )
        section = c.config.get("farm") if hasattr(c, "config") else None
        farm = settings.load(coordinator, farm_config, config_mod.invoke_section(section, "farm"))
        if count is not None and not str(count).strip().isdigit():
            raise ValueError(f"--count {outpaths.shown(count)} is not a whole number of places")
        requests = selection.requests(place or [], tag or [], int(count) if count else None)
        prov_section = c.config.get("provision") if hasattr(c, "config") else None
        inputs = run_inputs.read(prov_section, config, only, skip, artifacts)
    except (ValueError, config_mod.ConfigError) as exc:
        raise Exit(f"farm.{mode}: {exc}", code=exitcodes.USAGE) from None
    timeout = _seconds("--reserve-timeout", reserve_timeout, 300.0)
    boot = _seconds("--boot-timeout", boot_timeout, 300.0)
    if out is not None:
        problem = outpaths.dir_problem(Path(out).expanduser()) if out.strip() else "is empty"
        if problem:
            raise bad_flag("--out", out, problem)
    return FarmJob(
        settings=farm,
        requests=requests,
        out_dir=Path(out) if out else ROOT / "out" / "farm",
        root=ROOT,
        work_root=scratch.controller_cache(),
        provision_cfg=inputs.cfg,
        selected_steps=inputs.steps,
        options=Options(artifacts=inputs.artifacts),
        insecure_host_key=insecure_host_key,
        reserve_timeout_s=timeout,
        boot_timeout_s=boot,
        **extra,
    )


def _checkout_file(flag: str, value: str) -> str:
    """A file inside the checkout (the boards get the checkout, not other files), relative."""
    path = ROOT / value
    problem = outpaths.lookup_problem(path) if value.strip() else "is empty"
    if problem is None:
        try:
            relative = path.resolve().relative_to(ROOT.resolve())
        except ValueError:
            problem = "is outside the checkout; the boards only get the checkout's files"
        else:
            if path.is_file():
                return str(relative)
            problem = "is not a file in the checkout"
    raise bad_flag(flag, value, f"{problem} (default matrix.yaml)")


def _finish(job) -> None:
    from scripts.farm.run import run

    code, _, _ = run(job)
    if code:
        raise Exit(code=code)


@task(klass=CliTask, iterable=["place", "tag"], help=_COMMON_HELP)
def provision(c, coordinator=None, place=None, tag=None, count=None, farm_config=None,
              config=None, only=None, skip=None, artifacts=None, insecure_host_key=False,
              reserve_timeout=None, out=None, boot_timeout=None):  # fmt: skip
    """Reserve places and provision each board over SSH, in parallel."""
    job = _job(c, mode="provision", coordinator=coordinator, place=place, tag=tag, count=count,
               farm_config=farm_config, config=config, only=only, skip=skip, artifacts=artifacts,
               insecure_host_key=insecure_host_key, reserve_timeout=reserve_timeout, out=out,
               boot_timeout=boot_timeout)  # fmt: skip
    _finish(job)


@task(
    klass=CliTask,
    iterable=["place", "tag", "lane"],
    help={
        **_COMMON_HELP,
        "lane": "lane(s) to run on each board (repeatable or a comma list; required)",
        "matrix-file": "matrix file inside the checkout (default matrix.yaml)",
        "setup": "how the board gets its Python: bootstrap (default), kit or none",
        "board-python": "the board's interpreter for --setup kit/none (default python3)",
        "no-provision": "skip provisioning (the board is already provisioned)",
        "lane-timeout": "seconds for all lanes on one board (default 3600)",
        "ship-cache": "copy this machine's BPU artifact cache to each board before its lanes",
    },
)
def test(c, lane=None, coordinator=None, place=None, tag=None, count=None, farm_config=None,
         config=None, only=None, skip=None, artifacts=None, insecure_host_key=False,
         reserve_timeout=None, out=None, matrix_file="matrix.yaml", setup="bootstrap",
         board_python=None, no_provision=False, lane_timeout=None, boot_timeout=None,
         ship_cache=False):  # fmt: skip
    """Reserve places, provision each board, run lanes on it, merge every board's results."""
    from scripts.farm.board import SETUP_MODES

    lanes = [n.strip() for item in lane or [] for n in item.split(",") if n.strip()]
    if not lanes:
        raise Exit(
            "farm.test: name the lanes to run on the boards with --lane", code=exitcodes.USAGE
        )
    if setup not in SETUP_MODES:
        raise Exit(
            f"farm.test: --setup {setup!r} is not one of {', '.join(SETUP_MODES)}",
            code=exitcodes.USAGE,
        )
    if board_python is not None and not board_python.strip():
        raise bad_flag(
            "--board-python", board_python, "give the board's interpreter (or leave the flag out)"
        )
    matrix_file = _checkout_file("--matrix-file", matrix_file)
    from scripts.testmatrix.schema import MatrixError, load

    try:
        known = load(ROOT / matrix_file).lanes
    except MatrixError as exc:
        raise Exit(f"farm.test: {exc}", code=exitcodes.USAGE) from None
    unknown = [n for n in lanes if n not in known]
    if unknown:
        raise Exit(
            f"farm.test: unknown lane(s) {unknown}; {matrix_file} has {list(known)}",
            code=exitcodes.USAGE,
        )
    shipped = None
    if ship_cache:
        from scripts.tasks.cache_paths import cache_root

        shipped = cache_root(None)
        if not (shipped / "artifacts").is_dir():
            raise Exit(
                f"farm.test: --ship-cache: {shipped}/artifacts does not exist; compile first "
                "(invoke compile-host) or leave the flag out",
                code=exitcodes.USAGE,
            )
    job = _job(c, mode="test", coordinator=coordinator, place=place, tag=tag, count=count,
               farm_config=farm_config, config=config, only=only, skip=skip, artifacts=artifacts,
               insecure_host_key=insecure_host_key, reserve_timeout=reserve_timeout, out=out,
               boot_timeout=boot_timeout, provision=not no_provision, lanes=lanes, matrix_file=matrix_file, setup=setup,
               board_python=board_python, ship_cache=shipped,
               lane_timeout_s=_seconds("--lane-timeout", lane_timeout, 3600.0))  # fmt: skip
    _finish(job)


def register(ns: Collection) -> None:
    """Add the `farm` collection to the root collection."""
    ns.add_collection(Collection("farm", provision, test))

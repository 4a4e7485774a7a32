"""A lane `on_board`, run from a machine that is not a board: on the emulated board.

The emulated board (scripts/lab, booted from the lane's image) is held by this lane alone, so
the farm's place flow runs on it from its `provision` state on, with no coordinator:

    provision (torch_env, torch_fl built on the board, build_verify)
      -> ship the checkout -> scripts/bootstrap.sh completes the provisioned environment
      -> `python -m scripts.testmatrix --lane <this lane>` on the board -> fetch

There the lane runs as an ordinary pytest lane (the board is aarch64). Its per-test records come
back and are this lane's results: the board's capability detection decided which expectations
applied (no libcupti there). Where the place flow stops early (a build that fails, a board that
does not boot), that is this lane's infra-error, named.
"""

from __future__ import annotations

import re
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TextIO

import yaml

from scripts.testmatrix.junit import finish_junit
from scripts.testmatrix.processes import read_records
from scripts.testmatrix.results import LaneResult
from scripts.testmatrix.schema import Lane

# What provisioning does on the board before the lane: the environment, the library built there,
# and the proof that a small net compiles under the eager and sim executors.
STEPS = "torch_env,torch_fl,build_verify"
PLACE = "emulated-board"
EMULATOR_RERUNS = 1
"""Runs more of a lane that failed while qemu killed a process on the board with SIGILL. The
lab's qemu (TCG, Debian's 7.2) does that now and then, each time somewhere else (a wheel build's
backend, an interpreter of the exit tests: docs/board-lab.md); the lab boots with
debug.exception-trace=1, so the guest kernel names each such process. A lane that fails with no
such report, or fails again on a fresh board, fails."""
# The guest kernel's report of a process killed by an undefined instruction, e.g.
# "[   30.141454] udf[97]: unhandled exception: undefined instruction in udf[768,aaaad22f0000+10000]"
_GUEST_SIGILL = re.compile(r"^.*\S+\[\d+\]: unhandled exception: .*undefined instruction.*$", re.M)


def emulator_sigills(kernel_log: str) -> list[str]:
    """The guest kernel's lines about processes it killed with SIGILL (undefined instruction)."""
    return [m.group(0).strip() for m in _GUEST_SIGILL.finditer(kernel_log)]


def rerun_reason(result: LaneResult, sigills: list[str]) -> str | None:
    """Why a lane runs again on a fresh board (it failed and qemu killed a process with SIGILL
    meanwhile), or None."""
    if result.ok or not sigills:
        return None
    more = f" and {len(sigills) - 1} more" if len(sigills) > 1 else ""
    return f"the emulator killed a process with SIGILL during the lane ({sigills[0]}{more})"


class _Log:
    """Progress lines to the matrix's stream and to the lane's log file."""

    def __init__(self, path: Path, stream: TextIO | None) -> None:
        self.path, self.stream = path, stream or sys.stdout
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(path, "w", encoding="utf-8")
        self.started = time.monotonic()

    def __call__(self, msg: str) -> None:
        line = f"[{lane_clock(self.started)}] {msg}"
        self.fh.write(line + "\n")
        self.fh.flush()
        print(f"[board] {line}", file=self.stream, flush=True)

    def close(self) -> None:
        self.fh.close()


def lane_clock(started: float) -> str:
    seconds = int(time.monotonic() - started)
    return f"{seconds // 60:02d}:{seconds % 60:02d}"


def _products(page_size: str, image: str, log: _Log) -> tuple[Path, dict]:
    """The kernel and the image (built side by side when missing); the image's metadata."""
    from scripts.lab import cache, kernel, rootfs

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="board-lane") as pool:
        kernel_job = pool.submit(kernel.ensure, page_size)
        image_job = pool.submit(rootfs.ensure, image)
        _, kbuilt = kernel_job.result()
        archive, ibuilt = image_job.result()
    meta = cache.metadata(archive.parent)
    log(
        f"kernel {page_size} {'built' if kbuilt else 'cached'}; image {image} "
        f"{'built' if ibuilt else 'cached'} ({meta.get('versions')})"
    )
    return archive, meta


def _wheelhouse(meta: dict, log: _Log) -> Path:
    from scripts.lab import wheelhouse

    house, python = wheelhouse.for_image(meta)
    log(f"wheelhouse for Python {python} aarch64: {len(list(house.glob('*.whl')))} wheels")
    return house


def _job(root: Path, matrix_file: Path, lane: Lane, work: Path, lab, house: Path):
    from provision import run_inputs
    from provision.steps import Options
    from scripts.farm.job import FarmJob
    from scripts.farm.settings import FarmSettings

    cfg_file = work / "provision.yaml"
    cfg = {"ssh": {"known_hosts": str(lab.known_hosts), "identity": str(lab.identity)}}
    cfg_file.write_text(yaml.safe_dump(cfg))
    inputs = run_inputs.read(None, str(cfg_file), STEPS, None, str(house))
    return FarmJob(
        settings=FarmSettings(coordinator="", ssh={}),
        requests=[],
        out_dir=work / "farm",
        root=root,
        work_root=work / "controller",
        provision_cfg=inputs.cfg,
        selected_steps=inputs.steps,
        options=Options(artifacts=inputs.artifacts),
        lanes=[lane.name],
        matrix_file=str(matrix_file.resolve().relative_to(root.resolve())),
        setup="bootstrap",
        lane_timeout_s=lane.timeout,
    )


def _drive(job, lab, log: _Log):
    """The place flow from `provision` to `fetch` on the held emulated board; its outcome."""
    from provision.multihost import HostJob
    from provision.target import HostSpec
    from scripts.farm import place_flow
    from scripts.farm.report import PlaceOutcome

    outcome = PlaceOutcome(PLACE, place=PLACE)
    ctx = place_flow.PlaceContext(job, outcome, client=None, place=PLACE, echo=log)  # type: ignore[arg-type]
    ctx.host = HostJob(
        HostSpec("root", "127.0.0.1", lab.port),
        identity=str(lab.identity),
        known_hosts=str(lab.known_hosts),
        label=PLACE,
    )
    start = [name for name, _ in place_flow.STATES].index("provision")
    stop = place_flow.drive(ctx, place_flow.STATES[start:])
    log(
        f"place flow: {' -> '.join(ctx.trail)}"
        + (f" (stopped: {stop.reasons})" if stop.reasons else "")
    )
    return outcome


def run_on_emulated_board(lane: Lane, root: Path, matrix_file: Path, outputs, stream) -> LaneResult:
    """Run `lane` on a private emulated board booted from `lane.on_board`; its results (run
    again on a fresh board, up to EMULATOR_RERUNS times, where qemu's SIGILL is why it failed)."""
    started = time.monotonic()
    junit = outputs.junit(lane.name)
    log = _Log(outputs.log(lane.name), stream)
    result, records = LaneResult(lane.name, "ran", workers=lane.workers), []
    try:
        for attempt in range(EMULATOR_RERUNS + 1):
            result, records, sigills = _run_once(lane, root, matrix_file, outputs, log)
            for line in sigills:
                log(f"guest kernel: {line}")
            again = rerun_reason(result, sigills)
            if again is None or attempt == EMULATOR_RERUNS:
                break
            log(f"{again}: running the lane again on a fresh board ({result.buckets})")
    finally:
        result.duration_s = time.monotonic() - started
        log(f"lane finished in {result.duration_s:.0f}s: {result.buckets}")
        log.close()
        result.log = str(outputs.log(lane.name))
        finish_junit(result, junit, records)
    return result


def _run_once(
    lane: Lane, root: Path, matrix_file: Path, outputs, log: _Log
) -> tuple[LaneResult, list[dict], list[str]]:
    """One run of `lane` on a fresh board: its result, per-test records, and the guest kernel's
    SIGILL reports (read before the board stops)."""
    from scripts import lab as lab_pkg
    from scripts.farm.emu import PrivateLab

    result = LaneResult(lane.name, "ran", workers=lane.workers)
    junit = outputs.junit(lane.name)
    work = outputs.out_dir / "board" / lane.name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    image, page_size = lane.on_board or "", lab_pkg.DEFAULT_PAGE_SIZE
    records: list[dict] = []
    sigills: list[str] = []
    private = PrivateLab(work / "lab", page_size, image)
    lab = None
    try:
        try:
            ok, why = lab_pkg.capability(page_size, image)
            if not ok:
                result.add("infra-error", lane.name, f"the emulated board cannot start here: {why}")
                return result, records, sigills
            _, meta = _products(page_size, image, log)
            house = _wheelhouse(meta, log)
            log(f"booting the {page_size} board with the {image} image")
            lab = private.start()
            log(f"board up: ssh root@127.0.0.1:{lab.port}")
            job = _job(root, matrix_file, lane, work, lab, house)
            outcome = _drive(job, lab, log)
            _write_provision_summary(outcome, log)
            for path in outcome.results:
                if Path(path).name == f"{lane.name}.jsonl":
                    records = read_records(Path(path))
            for path in outcome.junit:
                if Path(path).name == f"{lane.name}.xml":
                    junit.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path, junit)
            _classify(result, records, outcome)
        except Exception as exc:  # noqa: BLE001 - any failure to get the lane going is its infra-error
            result.add("infra-error", lane.name, f"{type(exc).__name__}: {exc}")
        # Not on Ctrl-C: the board stops at once, unread.
        if lab is not None:
            sigills = _guest_sigills(lab, log)
    finally:
        private.stop()
    return result, records, sigills


def _guest_sigills(lab, log: _Log) -> list[str]:
    """The SIGILL reports in the running board's kernel log ([] where it cannot be read)."""
    from scripts.lab import vm

    try:
        board = vm.target(lab)
        try:
            rc, out, err = board.run("dmesg", timeout=60)
        finally:
            board.close()
    except Exception as exc:  # noqa: BLE001 - a board that no longer answers has no log to give
        log(f"the guest kernel's log could not be read: {type(exc).__name__}: {exc}")
        return []
    if rc != 0:
        log(f"the guest kernel's log could not be read (rc {rc}): {err.strip()[-200:]}")
        return []
    return emulator_sigills(out)


def _write_provision_summary(outcome, log: _Log) -> None:
    from scripts.farm.place_flow import provision_steps

    for name, (check, duration) in provision_steps(outcome).items():
        log(f"  provision {name}: {check.get('status')} in {duration}s")


def _classify(result: LaneResult, records: list[dict], outcome) -> None:
    """The board's result of the lane as this lane's (its buckets and problems, which include
    the lane-level ones: a timeout, a crash); the place flow's stops as infra-errors."""
    lanes = (outcome.summary or {}).get("lanes") or []
    board = next((entry for entry in lanes if entry.get("name") == result.name), None)
    if board is not None:
        for bucket, count in (board.get("buckets") or {}).items():
            if bucket in result.buckets:
                result.buckets[bucket] += int(count)
        result.problems += list(board.get("problems") or [])
        if board.get("status") == "not-run":
            result.add("infra-error", result.name, f"not run on the board: {board.get('missing')}")
    for reason in outcome.errors:
        result.add("infra-error", result.name, f"on the emulated board: {reason}")
    if board is None and not outcome.errors:
        got = f"{len(records)} per-test records but no summary" if records else "nothing"
        result.add("infra-error", result.name, f"the board sent back {got} for this lane")

"""Run matrix lanes as pytest (or ruff) subprocesses and bucket what happened.

Buckets: passed, failed, expected-fail, unexpected-pass, skipped, infra-error. Infra errors
(collection error, worker crash, timeout, missing tool, stale expectation, pytest internal/usage
error) are kept apart from test outcomes: a lane that never ran its tests must not look green, and
a broken machine must not look like a broken test. The run succeeds only when no lane has
failed, unexpected-pass or infra-error.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from scripts.testmatrix.capabilities import detect
from scripts.testmatrix.platforms import profile
from scripts.testmatrix.schema import Lane, Matrix, MatrixError, load

BUCKETS = ("passed", "failed", "expected-fail", "unexpected-pass", "skipped", "infra-error")
BAD_BUCKETS = ("failed", "unexpected-pass", "infra-error")
HARNESS_ROOT = Path(__file__).resolve().parents[2]
_PYTEST_RC = {
    2: "pytest was interrupted (rc 2)",
    3: "pytest internal error (rc 3)",
    4: "pytest usage error (rc 4)",
    5: "no tests collected (rc 5): the lane selects nothing",
}


@dataclass
class LaneResult:
    name: str
    status: str  # "ran" | "not-run"
    missing: list[str] = field(default_factory=list)
    buckets: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0))
    duration_s: float = 0.0
    workers: int = 1
    returncode: int | None = None
    junit: str | None = None
    log: str | None = None
    problems: list[dict[str, str]] = field(default_factory=list)

    def add(self, bucket: str, nodeid: str, message: str) -> None:
        self.buckets[bucket] += 1
        if bucket != "passed" and bucket != "skipped":
            self.problems.append({"bucket": bucket, "nodeid": nodeid, "message": message})

    @property
    def ok(self) -> bool:
        return self.status != "ran" or not any(self.buckets[b] for b in BAD_BUCKETS)


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _lane_env(lane: Lane, root: Path, workers: int) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        # An outer pytest (e.g. the unit lane testing this runner) must not leak into lanes.
        if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT_TEST")) and k != "PYTEST_ADDOPTS"
    }
    paths = [str(root), str(HARNESS_ROOT)] + [p for p in [env.get("PYTHONPATH")] if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    # N workers each running torch with all cores oversubscribes a 2-core box and makes the
    # parallel lane slower than the serial one; give each worker its share.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    env.update(lane.env)
    return env


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    """Kill the lane's whole process group (pytest, xdist workers, their children)."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _raise_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _read_records(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
    return records


def _log_tail(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(no output)"


def run_pytest_lane(
    lane: Lane,
    matrix_file: Path,
    root: Path,
    caps_file: Path,
    out_dir: Path,
    junit_dir: Path,
    workers: int | None = None,
) -> LaneResult:
    workers = workers or lane.workers
    result = LaneResult(lane.name, "ran", workers=workers)
    start = time.monotonic()
    missing_paths = [p for p in lane.paths if not (root / p).exists()]
    if missing_paths:
        result.add("infra-error", lane.name, f"lane path(s) missing: {', '.join(missing_paths)}")
        return result
    if workers > 1 and importlib.util.find_spec("xdist") is None:
        result.add("infra-error", lane.name, "missing tool: pytest-xdist (pip install it)")
        return result
    results_file = out_dir / "results" / f"{lane.name}.jsonl"
    results_file.parent.mkdir(parents=True, exist_ok=True)
    results_file.unlink(missing_ok=True)
    junit = junit_dir / f"{lane.name}.xml"
    junit_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / "logs" / f"{lane.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pytest", "-p", "scripts.testmatrix.plugin",
        "--matrix-file", str(matrix_file), "--matrix-lane", lane.name,
        "--matrix-caps", str(caps_file), "--matrix-results", str(results_file),
        f"--junitxml={junit}", "-o", f"junit_suite_name={lane.name}",
        "--rootdir", str(root), "-p", "no:cacheprovider", "-q", "-rfE",
    ]  # fmt: skip
    if workers > 1:
        cmd += ["-n", str(workers)]
    if lane.keyword:
        cmd += ["-k", lane.keyword]
    if lane.markers:
        cmd += ["-m", lane.markers]
    cmd += lane.paths
    timed_out = False
    with open(log, "wb") as log_fh:
        proc = subprocess.Popen(
            cmd,
            cwd=root,
            env=_lane_env(lane, root, workers),
            stdout=log_fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        # The lane runs in its own session (so a timeout can kill its whole group); if the
        # runner itself is stopped (Ctrl-C, SIGTERM from CI), take the lane down with it.
        previous = signal.signal(signal.SIGTERM, _raise_exit)
        try:
            proc.wait(timeout=lane.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _terminate(proc)
        except BaseException:
            _terminate(proc)
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
    result.duration_s = time.monotonic() - start
    result.returncode = proc.returncode
    result.log = str(log)
    result.junit = str(junit) if junit.is_file() else None
    _classify(result, _read_records(results_file), timed_out, lane.timeout, log)
    return result


def _classify(
    result: LaneResult, records: list[dict[str, Any]], timed_out: bool, timeout: float, log: Path
) -> None:
    for rec in records:
        event = rec.get("event")
        if event == "collect-error":
            result.add("infra-error", rec["nodeid"], f"collection error: {rec['message']}")
        elif event == "stale":
            result.add("infra-error", rec["expectation"], rec["message"])
        elif event is None:
            result.add(rec["bucket"], rec["nodeid"], rec.get("message", ""))
    rc = result.returncode
    if timed_out:
        done = sum(result.buckets.values())
        result.add("infra-error", result.name, f"timeout after {timeout:.0f}s ({done} finished)")
    elif rc is not None and rc < 0:
        result.add("infra-error", result.name, f"pytest died with signal {-rc}: {_log_tail(log)}")
    elif rc in _PYTEST_RC:
        if not (rc == 2 and result.buckets["infra-error"]):
            result.add("infra-error", result.name, f"{_PYTEST_RC[rc]}: {_log_tail(log)}")
    elif rc == 1 and not any(result.buckets[b] for b in BAD_BUCKETS):
        result.add(
            "infra-error", result.name, f"pytest failed with no failing test: {_log_tail(log)}"
        )


def _write_junit(path: Path, suite: str, cases: list[tuple[str, float, str | None]]) -> None:
    failures = sum(1 for _, _, failure in cases if failure is not None)
    root = ET.Element("testsuites")
    ts = ET.SubElement(
        root, "testsuite", name=suite, tests=str(len(cases)), failures=str(failures), errors="0"
    )
    for name, seconds, failure in cases:
        case = ET.SubElement(ts, "testcase", classname=suite, name=name, time=f"{seconds:.3f}")
        if failure is not None:
            ET.SubElement(case, "failure", message=failure.splitlines()[0][:200]).text = failure
    _atomic_write(path, ET.tostring(root, encoding="unicode"))


def run_ruff_lane(lane: Lane, root: Path, out_dir: Path, junit_dir: Path) -> LaneResult:
    """`ruff check` + `ruff format --check`, each one test case."""
    result = LaneResult(lane.name, "ran")
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not os.access(ruff, os.X_OK):
        result.add("infra-error", lane.name, "missing tool: ruff (pip install ruff)")
        return result
    cases: list[tuple[str, float, str | None]] = []
    log = out_dir / "logs" / f"{lane.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log_text = []
    start = time.monotonic()
    for name, args in (("ruff-check", ["check"]), ("ruff-format", ["format", "--check"])):
        t0 = time.monotonic()
        try:
            proc = subprocess.run(
                [ruff, *args, *lane.paths],
                cwd=root,
                capture_output=True,
                text=True,
                timeout=lane.timeout,
            )
        except subprocess.TimeoutExpired:
            result.add("infra-error", f"lint::{name}", f"timeout after {lane.timeout:.0f}s")
            continue
        output = (proc.stdout + proc.stderr).strip()
        log_text.append(f"$ ruff {' '.join(args)} {' '.join(lane.paths)}\n{output}\n")
        if proc.returncode == 0:
            result.add("passed", f"lint::{name}", "")
            cases.append((name, time.monotonic() - t0, None))
        elif proc.returncode == 1:
            summary = next((ln for ln in reversed(output.splitlines()) if ln.strip()), "")
            result.add("failed", f"lint::{name}", summary)
            cases.append((name, time.monotonic() - t0, output or summary))
        else:  # rc 2: ruff itself could not run (bad config, bad path)
            result.add("infra-error", f"lint::{name}", f"ruff rc {proc.returncode}: {output[:200]}")
    result.duration_s = time.monotonic() - start
    _atomic_write(log, "\n".join(log_text))
    result.log = str(log)
    junit = junit_dir / f"{lane.name}.xml"
    _write_junit(junit, lane.name, cases)
    result.junit = str(junit)
    return result


# -- planning and reporting ---------------------------------------------------------------------


def select_lanes(matrix: Matrix, names: list[str] | None) -> list[Lane]:
    """Lanes named on the command line (comma lists allowed), in matrix order; all if none."""
    if not names:
        return list(matrix.lanes.values())
    wanted = [n.strip() for item in names for n in item.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in matrix.lanes]
    if unknown:
        raise MatrixError(
            matrix.path,
            0,
            f"unknown lane(s) {', '.join(unknown)}; known: {', '.join(matrix.lanes)}",
        )
    return [lane for name, lane in matrix.lanes.items() if name in wanted]


def format_plan(matrix: Matrix, lanes: list[Lane], caps: dict[str, Any], platform: str) -> str:
    out = [
        f"platform: {platform}",
        "capabilities: " + ", ".join(f"{k}={v}" for k, v in caps.items()),
    ]
    out.append(f"{'lane':<18}{'kind':<8}{'workers':>8}{'timeout':>9}  plan")
    for lane in lanes:
        missing = lane.missing(caps)
        plan = (
            f"not run (missing: {', '.join(missing)})" if missing else "run " + " ".join(lane.paths)
        )
        out.append(f"{lane.name:<18}{lane.kind:<8}{lane.workers:>8}{lane.timeout:>8.0f}s  {plan}")
        for exp in matrix.expectations:
            if exp.active(lane.name, caps):
                out.append(
                    f"{'':<18}expect {exp.status}: {exp.test}  [{exp.location}: {exp.reason}]"
                )
    return "\n".join(out)


_SHORT = {"expected-fail": "xfail", "unexpected-pass": "xpass", "infra-error": "infra"}


def format_table(results: list[LaneResult]) -> str:
    heads = ["lane", *(_SHORT.get(b, b) for b in BUCKETS), "workers", "time", "result"]
    rows = [heads]
    for r in results:
        if r.status == "ran":
            counts = [str(r.buckets[b]) for b in BUCKETS]
            verdict = "ok" if r.ok else "FAIL"
            rows.append([r.name, *counts, str(r.workers), f"{r.duration_s:.1f}s", verdict])
        else:
            missing = f"not run (missing: {', '.join(r.missing)})"
            rows.append([r.name, *["-"] * len(BUCKETS), "-", "-", missing])
    total = sum(r.duration_s for r in results)
    sums = [str(sum(r.buckets[b] for r in results if r.status == "ran")) for b in BUCKETS]
    rows.append(["total", *sums, "", f"{total:.1f}s", ""])
    widths = [max(len(row[i]) for row in rows) for i in range(len(heads) - 1)]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:-1], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells + [row[-1]]).rstrip())
    return "\n".join(lines)


def format_problems(results: list[LaneResult], limit: int = 20) -> str:
    out = []
    for r in results:
        for p in r.problems[:limit]:
            if p["bucket"] == "expected-fail":
                continue
            out.append(f"  [{r.name}] {p['bucket']}: {p['nodeid']}: {p['message']}")
        if r.log and not r.ok:
            out.append(f"  [{r.name}] full log: {r.log}")
    return "\n".join(out)


def run_matrix(
    root: Path,
    matrix_file: Path,
    lanes: list[str] | None = None,
    platform: str | None = None,
    list_only: bool = False,
    json_path: Path | None = None,
    junit_dir: Path | None = None,
    out_dir: Path | None = None,
    workers: int | None = None,
    require: list[str] | None = None,
    stream: TextIO | None = None,
    caps: dict[str, Any] | None = None,
) -> int:
    """Validate, plan, run, report. Returns the exit code (0 only when every ran lane is clean)."""
    stream = stream or sys.stdout
    matrix = load(matrix_file)
    selected = select_lanes(matrix, lanes)
    if platform:
        try:
            caps, platform_name = profile(platform), platform
        except KeyError as err:
            raise MatrixError(str(matrix_file), 0, str(err.args[0])) from None
    elif caps is not None:
        platform_name = "given"  # callers that already know (tests, a wrapping tool)
    else:
        caps, platform_name = detect(), "detected"
    if list_only or platform:
        # A forced profile describes another machine: show what would happen there, run nothing.
        print(format_plan(matrix, selected, caps, platform_name), file=stream)
        return 0
    out_dir = out_dir or root / "out" / "matrix"
    junit_dir = junit_dir or out_dir / "junit"
    caps_file = out_dir / "capabilities.json"
    _atomic_write(caps_file, json.dumps(caps, indent=2))
    results: list[LaneResult] = []
    started = time.time()
    for lane in selected:
        missing = lane.missing(caps)
        if missing:
            results.append(LaneResult(lane.name, "not-run", missing=missing))
            print(f"[matrix] {lane.name}: not run (missing: {', '.join(missing)})", file=stream)
            continue
        print(
            f"[matrix] {lane.name}: running ({workers or lane.workers} worker(s)) ...",
            file=stream,
            flush=True,
        )
        if lane.kind == "ruff":
            res = run_ruff_lane(lane, root, out_dir, junit_dir)
        else:
            res = run_pytest_lane(
                lane, matrix_file.resolve(), root, caps_file, out_dir, junit_dir, workers
            )
        results.append(res)
    for name in require or []:
        res = next((r for r in results if r.name == name), None)
        if res is not None and res.status == "not-run":
            res.status = "ran"
            res.add("infra-error", name, f"required lane not run: missing {', '.join(res.missing)}")
    print(format_table(results), file=stream)
    problems = format_problems(results)
    if problems:
        print(problems, file=stream)
    code = 0 if all(r.ok for r in results) else 1
    summary = {
        "platform": platform_name,
        "capabilities": caps,
        "started": started,
        "duration_s": time.time() - started,
        "exit_code": code,
        "lanes": [asdict(r) for r in results],
    }
    if json_path is not None:
        _atomic_write(json_path, json.dumps(summary, indent=2))
    _atomic_write(out_dir / "summary.json", json.dumps(summary, indent=2))
    return code

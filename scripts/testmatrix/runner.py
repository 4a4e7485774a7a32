"""Run matrix lanes as pytest (or ruff) subprocesses and bucket what happened.

Buckets: passed, failed, expected-fail, unexpected-pass, skipped, infra-error. Infra errors
(collection error, worker crash, timeout, missing tool, stale expectation, pytest internal/usage
error) are kept apart from test outcomes: a lane that never ran its tests must not look green, and
a broken machine must not look like a broken test. The run succeeds only when no lane has
failed, unexpected-pass or infra-error.

Reports are only ever about this run: every output of the previous run (junit, results, logs,
summaries) is removed before the first lane starts, so a lane killed half-way can never be
represented by an older, greener file.
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from provision import light
from scripts import outpaths, progress
from scripts.testmatrix.capabilities import detect, enable_hint
from scripts.testmatrix.platforms import profile
from scripts.testmatrix.schema import Lane, Matrix, MatrixError, load

BUCKETS = ("passed", "failed", "expected-fail", "unexpected-pass", "skipped", "infra-error")
BAD_BUCKETS = ("failed", "unexpected-pass", "infra-error")
HARNESS_ROOT = Path(__file__).resolve().parents[2]
INTERRUPTED = 130  # 128 + SIGINT
_PYTEST_RC = {
    2: "pytest was interrupted (rc 2)",
    3: "pytest internal error (rc 3)",
    4: "pytest usage error (rc 4)",
    5: "no tests collected (rc 5): the lane selects nothing",
}


class UsageError(Exception):
    """A bad command-line value (output path, --require lane, --rerun-failed without results)."""


@dataclass
class LaneResult:
    name: str
    status: str  # "ran" | "not-run" | "interrupted"
    missing: list[str] = field(default_factory=list)
    enable: str = ""  # the command that would let a not-run lane run here
    buckets: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0))
    duration_s: float = 0.0
    workers: int = 1
    returncode: int | None = None
    junit: str | None = None
    log: str | None = None
    problems: list[dict[str, str]] = field(default_factory=list)
    selected: list[str] = field(default_factory=list)  # node ids when only some tests ran

    def add(self, bucket: str, nodeid: str, message: str) -> None:
        self.buckets[bucket] += 1
        if bucket != "passed" and bucket != "skipped":
            self.problems.append({"bucket": bucket, "nodeid": nodeid, "message": message})

    @property
    def ok(self) -> bool:
        if self.status == "not-run":
            return True
        return self.status == "ran" and not any(self.buckets[b] for b in BAD_BUCKETS)


_atomic_write = light.load("atomic").write_text


class _PipeSafe:
    """A text stream whose reader may leave early (`invoke test --matrix | head`).

    The run goes on and its files (summary.json, junit) are still written; only output nobody
    reads is dropped. The descriptor is pointed at /dev/null so the flush at exit cannot fail.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._gone = False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                self._stream.write(text)
            except BrokenPipeError:
                self._reader_left()
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._reader_left()

    def isatty(self) -> bool:
        return not self._gone and self._stream.isatty()

    def _reader_left(self) -> None:
        self._gone = True
        try:
            fd = self._stream.fileno()
        except (OSError, ValueError, AttributeError):
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)


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


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _read_records(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
    return records


def _progress(records: list[dict[str, Any]]) -> tuple[int, int | None, list[str]]:
    """(tests finished, tests collected or None, node ids started but not finished)."""
    total = next((r["count"] for r in records if r.get("event") == "collected"), None)
    finished = {r["nodeid"] for r in records if r.get("event") is None and "bucket" in r}
    running = [
        r["nodeid"]
        for r in records
        if r.get("event") == "start" and r.get("nodeid") not in finished
    ]
    return len(finished), total, running


def _log_tail(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(no output)"


def _unmet_precondition(lane: Lane, root: Path, workers: int) -> str:
    """Why the lane cannot start at all (an infra-error), or ""."""
    missing_paths = [p for p in lane.paths if not (root / p).exists()]
    if missing_paths:
        return f"lane path(s) missing: {', '.join(missing_paths)}"
    if workers > 1 and importlib.util.find_spec("xdist") is None:
        return "missing tool: pytest-xdist (pip install it)"
    if lane.test_timeout and importlib.util.find_spec("pytest_timeout") is None:
        return "missing tool: pytest-timeout (pip install it)"
    return ""


def _pytest_command(
    lane: Lane,
    matrix_file: Path,
    root: Path,
    caps_file: Path,
    results_file: Path,
    junit: Path,
    workers: int,
    nodeids: list[str] | None,
    pytest_args: tuple[str, ...] = (),
) -> list[str]:
    cmd = [
        sys.executable, "-m", "pytest", "-p", "scripts.testmatrix.plugin",
        "--matrix-file", str(matrix_file), "--matrix-lane", lane.name,
        "--matrix-caps", str(caps_file), "--matrix-results", str(results_file),
        f"--junitxml={junit}", "-o", f"junit_suite_name={lane.name}",
        "--rootdir", str(root), "-p", "no:cacheprovider", "-q", "-rfE",
    ]  # fmt: skip
    if workers > 1:
        cmd += ["-n", str(workers)]
    if lane.test_timeout:
        # One hung test fails alone, named, and the lane's other results survive.
        cmd += [f"--timeout={lane.test_timeout:g}"]
    if lane.keyword:
        cmd += ["-k", lane.keyword]
    if lane.markers:
        cmd += ["-m", lane.markers]
    if nodeids:
        cmd += ["--matrix-subset", *nodeids]
    else:
        cmd += lane.paths
    if pytest_args:
        # the user's own selection (-k, -m, -x, node ids...) after the lane's: the lane's
        # expectations still apply, but staleness needs the whole lane
        cmd += ["--matrix-subset", *pytest_args] if not nodeids else list(pytest_args)
    return cmd


def run_pytest_lane(
    lane: Lane,
    matrix_file: Path,
    root: Path,
    caps_file: Path,
    out_dir: Path,
    junit_dir: Path,
    workers: int | None = None,
    stream: TextIO | None = None,
    nodeids: list[str] | None = None,
    pytest_args: tuple[str, ...] = (),
) -> LaneResult:
    """Run one lane (or only `nodeids` of it, and `pytest_args` passed through to pytest); a
    Ctrl-C/SIGTERM returns status "interrupted"."""
    workers = workers or lane.workers
    result = LaneResult(lane.name, "ran", workers=workers, selected=list(nodeids or []))
    start = time.monotonic()
    junit = junit_dir / f"{lane.name}.xml"
    unmet = _unmet_precondition(lane, root, workers)
    if unmet:
        result.add("infra-error", lane.name, unmet)
        _finish_junit(result, junit)
        return result
    results_file = out_dir / "results" / f"{lane.name}.jsonl"
    results_file.parent.mkdir(parents=True, exist_ok=True)
    results_file.unlink(missing_ok=True)
    junit_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / "logs" / f"{lane.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = _pytest_command(
        lane, matrix_file, root, caps_file, results_file, junit, workers, nodeids, pytest_args
    )
    timed_out = interrupted = False
    beat = progress.heartbeat(f"matrix {lane.name}", stream=stream or sys.stdout)
    with open(log, "wb") as log_fh, beat:
        proc = subprocess.Popen(
            cmd,
            cwd=root,
            env=_lane_env(lane, root, workers),
            stdout=log_fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        # The lane runs in its own session (so a timeout can kill its whole group, and a
        # terminal's Ctrl-C reaches only the runner); the runner takes the lane down with it.
        deadline = start + lane.timeout
        try:
            while True:
                try:
                    proc.wait(timeout=1.0)
                    break
                except subprocess.TimeoutExpired:
                    done, total, running = _progress(_read_records(results_file))
                    beat.update(done=done, total=total, note=", ".join(running[:2]))
                    if time.monotonic() > deadline:
                        timed_out = True
                        _terminate(proc)
                        break
        except KeyboardInterrupt:
            interrupted = True
            _terminate(proc)
    result.duration_s = time.monotonic() - start
    result.returncode = proc.returncode
    result.log = str(log)
    records = _read_records(results_file)
    _classify(result, records, timed_out, lane.timeout, log, interrupted)
    _finish_junit(result, junit, records)
    return result


def _classify(
    result: LaneResult,
    records: list[dict[str, Any]],
    timed_out: bool,
    timeout: float,
    log: Path,
    interrupted: bool = False,
) -> None:
    for rec in records:
        event = rec.get("event")
        if event == "collect-error":
            result.add("infra-error", rec["nodeid"], f"collection error: {rec['message']}")
        elif event == "stale":
            result.add("infra-error", rec["expectation"], rec["message"])
        elif event is None:
            result.add(rec["bucket"], rec["nodeid"], rec.get("message", ""))
    done, _, running = _progress(records)
    rc = result.returncode
    if interrupted:
        result.status = "interrupted"
        for nodeid in running:
            result.add("infra-error", nodeid, "interrupted while running (Ctrl-C/SIGTERM)")
        if not running:
            result.add("infra-error", result.name, f"interrupted ({done} finished)")
    elif timed_out:
        for nodeid in running:
            result.add(
                "infra-error", nodeid, f"still running when the lane timed out ({timeout:.0f}s)"
            )
        result.add(
            "infra-error",
            result.name,
            f"lane timeout after {timeout:.0f}s ({done} finished"
            + (f"; hung: {', '.join(running)}" if running else "")
            + ")",
        )
    elif rc is not None and rc < 0:
        result.add("infra-error", result.name, f"pytest died with signal {-rc}: {_log_tail(log)}")
    elif rc in _PYTEST_RC:
        if not (rc == 2 and result.buckets["infra-error"]):
            result.add("infra-error", result.name, f"{_PYTEST_RC[rc]}: {_log_tail(log)}")
    elif rc == 1 and not any(result.buckets[b] for b in BAD_BUCKETS):
        result.add(
            "infra-error", result.name, f"pytest failed with no failing test: {_log_tail(log)}"
        )


# -- junit --------------------------------------------------------------------------------------


# Characters XML 1.0 cannot hold (colour codes, NUL): written as \xNN so the file stays junit.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_safe(text: str) -> str:
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def make_xml_safe(tree: ET.Element) -> None:
    """Rewrite every text and attribute of `tree` in place so it serializes as valid XML."""
    for element in tree.iter():
        element.text = _xml_safe(element.text) if element.text else element.text
        for key, value in element.attrib.items():
            element.set(key, _xml_safe(value))


def _case_ids(case: ET.Element) -> set[str]:
    ids = {p.get("value", "") for p in case.iter("property") if p.get("name") == "nodeid"}
    ids.add(f"{case.get('classname', '')}::{case.get('name', '')}")
    return ids


def _finish_junit(
    result: LaneResult, junit: Path, records: list[dict[str, Any]] | None = None
) -> None:
    """Make `junit` tell the whole story of this run of the lane.

    pytest writes its junit only when it finishes; a lane killed by its timeout or a Ctrl-C
    leaves none, and pytest never knows about stale expectations or the lane's own timeout.
    Missing files are rebuilt from the per-test results, and every infra-error that is not
    already a testcase becomes an `<error>` testcase, so dashboards cannot show green.
    """
    tree: ET.Element | None = None
    if junit.is_file():
        try:
            tree = ET.parse(junit).getroot()
        except ET.ParseError:
            tree = None  # cut short by a kill: rebuild below
    if tree is None:
        tree = ET.Element("testsuites")
        suite = ET.SubElement(tree, "testsuite", name=result.name)
        for rec in records or []:
            if rec.get("event") is not None or "bucket" not in rec:
                continue
            case = ET.SubElement(
                suite, "testcase", classname=result.name, name=rec["nodeid"], time="0"
            )
            props = ET.SubElement(case, "properties")
            ET.SubElement(props, "property", name="nodeid", value=rec["nodeid"])
            if rec.get("expectation"):
                ET.SubElement(
                    props, "property", name="matrix_expectation", value=rec["expectation"]
                )
            bucket = rec["bucket"]
            message = rec.get("message", "")
            if bucket in ("failed", "unexpected-pass"):
                ET.SubElement(case, "failure", message=message[:200]).text = message
            elif bucket == "infra-error":
                ET.SubElement(case, "error", message=message[:200]).text = message
            elif bucket in ("skipped", "expected-fail"):
                kind = "pytest.xfail" if bucket == "expected-fail" else "pytest.skip"
                ET.SubElement(case, "skipped", type=kind, message=message[:200])
    suite = tree.find("testsuite") if tree.tag == "testsuites" else tree
    if suite is None:
        suite = ET.SubElement(tree, "testsuite", name=result.name)
    known: set[str] = set()
    for case in suite.iter("testcase"):
        known |= _case_ids(case)
    for problem in result.problems:
        nodeid = problem["nodeid"]
        # pytest names a collection error's testcase after the module (tests.a.test_b).
        dotted = nodeid[:-3].replace("/", ".") if nodeid.endswith(".py") else nodeid
        if problem["bucket"] != "infra-error" or {nodeid, f"::{dotted}"} & known:
            continue
        case = ET.SubElement(
            suite, "testcase", classname=f"{result.name}.matrix", name=problem["nodeid"], time="0"
        )
        props = ET.SubElement(case, "properties")
        ET.SubElement(props, "property", name="nodeid", value=problem["nodeid"])
        ET.SubElement(case, "error", message=problem["message"][:200]).text = problem["message"]
        known.add(problem["nodeid"])
    make_xml_safe(tree)
    cases = list(suite.iter("testcase"))
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(1 for c in cases if c.find("failure") is not None)))
    suite.set("errors", str(sum(1 for c in cases if c.find("error") is not None)))
    suite.set("skipped", str(sum(1 for c in cases if c.find("skipped") is not None)))
    _atomic_write(junit, ET.tostring(tree, encoding="unicode"))
    result.junit = str(junit)


# Static import-cycle check over the repository at the lane's root (nothing is imported).
CHECK_IMPORTS = Path(__file__).resolve().parents[1] / "check_imports.py"


def run_ruff_lane(lane: Lane, root: Path, out_dir: Path, junit_dir: Path) -> LaneResult:
    """`ruff check`, `ruff format --check` and the import-cycle check, each one test case."""
    result = LaneResult(lane.name, "ran")
    junit = junit_dir / f"{lane.name}.xml"
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not os.access(ruff, os.X_OK):
        result.add("infra-error", lane.name, "missing tool: ruff (pip install ruff)")
        _finish_junit(result, junit)
        return result
    records: list[dict[str, Any]] = []
    log = out_dir / "logs" / f"{lane.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log_text = []
    start = time.monotonic()
    commands = (
        ("ruff-check", [ruff, "check", *lane.paths]),
        ("ruff-format", [ruff, "format", "--check", *lane.paths]),
        ("import-cycles", [sys.executable, str(CHECK_IMPORTS), str(root)]),
    )
    for name, argv in commands:
        nodeid = f"lint::{name}"
        try:
            proc = subprocess.run(
                argv,
                cwd=root,
                capture_output=True,
                text=True,
                timeout=lane.timeout,
            )
        except subprocess.TimeoutExpired:
            result.add("infra-error", nodeid, f"timeout after {lane.timeout:.0f}s")
            continue
        output = (proc.stdout + proc.stderr).strip()
        log_text.append(f"$ {' '.join(argv)}\n{output}\n")
        if proc.returncode == 0:
            result.add("passed", nodeid, "")
            records.append({"nodeid": nodeid, "bucket": "passed"})
        elif proc.returncode == 1:
            summary = next((ln for ln in reversed(output.splitlines()) if ln.strip()), "")
            result.add("failed", nodeid, summary)
            records.append({"nodeid": nodeid, "bucket": "failed", "message": output or summary})
        else:  # rc 2: the tool itself could not run (bad config, bad path, unparsable file)
            result.add("infra-error", nodeid, f"{name} rc {proc.returncode}: {output[:200]}")
    result.duration_s = time.monotonic() - start
    _atomic_write(log, "\n".join(log_text))
    result.log = str(log)
    junit.unlink(missing_ok=True)
    _finish_junit(result, junit, records)
    return result


# -- planning and reporting ---------------------------------------------------------------------


def select_lanes(matrix: Matrix, names: list[str] | None) -> list[Lane]:
    """Lanes named on the command line (comma lists allowed), in matrix order; all if none."""
    if not names:
        return list(matrix.lanes.values())
    wanted = [n.strip() for item in names for n in item.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in matrix.lanes]
    if unknown:  # a flag value, not a line of matrix.yaml
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, list(matrix.lanes), n=1)
            hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise UsageError(
            f"--lane: unknown lane(s) {', '.join(hints)}; known: {', '.join(matrix.lanes)}"
        )
    return [lane for name, lane in matrix.lanes.items() if name in wanted]


def _not_run_text(missing: list[str], enable: str) -> str:
    text = f"not run (missing: {', '.join(missing)})"
    return f"{text}; enable: {enable}" if enable else text


def format_plan(matrix: Matrix, lanes: list[Lane], caps: dict[str, Any], platform: str) -> str:
    out = [
        f"platform: {platform}",
        "capabilities: " + ", ".join(f"{k}={v}" for k, v in caps.items()),
    ]
    out.append(f"{'lane':<18}{'kind':<8}{'workers':>8}{'timeout':>9}{'per test':>10}  plan")
    for lane in lanes:
        missing = lane.missing(caps)
        plan = (
            _not_run_text(missing, enable_hint(missing))
            if missing
            else "run " + " ".join(lane.paths)
        )
        per_test = f"{lane.test_timeout:.0f}s" if lane.test_timeout else "-"
        out.append(
            f"{lane.name:<18}{lane.kind:<8}{lane.workers:>8}{lane.timeout:>8.0f}s"
            f"{per_test:>10}  {plan}"
        )
        for exp in matrix.expectations:
            if exp.active(lane.name, caps):
                out.append(
                    f"{'':<18}expect {exp.status}: {exp.test}  [{exp.location}: {exp.reason}]"
                )
    return "\n".join(out)


_SHORT = {"expected-fail": "xfail", "unexpected-pass": "xpass", "infra-error": "infra"}


def _verdict(r: LaneResult) -> str:
    if r.status == "interrupted":
        return "INTERRUPTED"
    if r.status == "not-run":
        return _not_run_text(r.missing, r.enable)
    return "ok" if r.ok else "FAIL"


def _rows(results: list[LaneResult]) -> tuple[list[str], list[list[str]]]:
    heads = ["lane", *(_SHORT.get(b, b) for b in BUCKETS), "workers", "time", "result"]
    rows = []
    for r in results:
        if r.status == "not-run":
            rows.append([r.name, *["-"] * len(BUCKETS), "-", "-", _verdict(r)])
        else:
            counts = [str(r.buckets[b]) for b in BUCKETS]
            rows.append([r.name, *counts, str(r.workers), f"{r.duration_s:.1f}s", _verdict(r)])
    total = sum(r.duration_s for r in results)
    sums = [str(sum(r.buckets[b] for r in results if r.status != "not-run")) for b in BUCKETS]
    rows.append(["total", *sums, "", f"{total:.1f}s", ""])
    return heads, rows


def format_table(results: list[LaneResult]) -> str:
    heads, rows = _rows(results)
    rows = [heads, *rows]
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


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").replace("`", "'")


def format_markdown(results: list[LaneResult], code: int, platform: str, limit: int = 20) -> str:
    """The lane table and every failure with its first error line, as GitHub Markdown."""
    verdict = {0: "passed", INTERRUPTED: "interrupted"}.get(code, "FAILED")
    heads, rows = _rows(results)
    out = [
        f"## Test matrix: {verdict}",
        "",
        f"platform: {platform}",
        "",
        "| " + " | ".join(heads) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(heads) - 2) + ["---"]) + "|",
    ]
    out += ["| " + " | ".join(_md(c) for c in row) + " |" for row in rows]
    failures = [(r.name, p) for r in results for p in r.problems if p["bucket"] in BAD_BUCKETS]
    if failures:
        out += ["", "### Failures", ""]
        for lane, p in failures[:limit]:
            first = p["message"].strip().splitlines()[0] if p["message"].strip() else ""
            out.append(f"- **{lane}** {p['bucket']}: `{_md(p['nodeid'])}`: {_md(first)[:300]}")
        if len(failures) > limit:
            out.append(f"- ... and {len(failures) - limit} more (see summary.json)")
    if code == INTERRUPTED:
        out += ["", "The run was interrupted; re-run to finish the remaining lanes."]
    return "\n".join(out) + "\n"


# -- outputs of earlier runs ----------------------------------------------------------------------


class _Busy(UsageError):
    pass


@contextlib.contextmanager
def _exclusive(out_dir: Path):
    """One matrix run per output directory at a time: two runs in one checkout would clear and
    rewrite each other's junit files and summaries. The lock is an flock, so it ends with its
    process, however that ends."""
    out_dir.mkdir(parents=True, exist_ok=True)
    fh = open(out_dir / ".run.lock", "a+")  # noqa: SIM115 - closed below
    try:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _Busy(
                f"another matrix run is writing {out_dir} now; wait for it to finish (or run this "
                "one as `python -m scripts.testmatrix --out-dir DIR`)"
            ) from None
        yield
    finally:
        fh.close()


def _earlier_lanes(summary_file: Path, covered: set[str]) -> list[dict[str, Any]]:
    """The lane records of the last summary (its own and those it kept) for lanes outside
    `covered`; an unreadable summary keeps nothing."""
    try:
        summary = json.loads(summary_file.read_text(encoding="utf-8"))
        records = [*summary.get("earlier_lanes", []), *summary["lanes"]]
        kept = {r["name"]: r for r in records if isinstance(r, dict) and "name" in r}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []
    return [record for name, record in kept.items() if name not in covered]


def _clear_outputs(out_dir: Path, junit_dir: Path, lane_names: list[str]) -> None:
    """Remove every output a previous run left for these lanes (and the summaries)."""
    for name in lane_names:
        for path in (
            junit_dir / f"{name}.xml",
            out_dir / "results" / f"{name}.jsonl",
            out_dir / "logs" / f"{name}.log",
        ):
            path.unlink(missing_ok=True)
    for name in ("summary.json", "summary.md"):
        (out_dir / name).unlink(missing_ok=True)


def failed_last_time(summary_file: Path, matrix: Matrix) -> dict[str, list[str] | None]:
    """lane -> node ids that failed in the run recorded in `summary_file` (None: the whole lane).

    Lane-level problems (timeout, crash, stale expectation, a lint failure) rerun the whole
    lane; test failures rerun just those tests.
    """
    if not summary_file.is_file():
        raise UsageError(
            f"--rerun-failed: no results of an earlier run in {summary_file}; "
            "run `invoke test --matrix` first"
        )
    try:
        summary = json.loads(summary_file.read_text(encoding="utf-8"))
        selection = _failed_lanes([*summary.get("earlier_lanes", []), *summary["lanes"]], matrix)
        if summary.get("interrupted"):
            # Lanes the interrupted run never reached have not passed either: run them whole.
            reached = {lane["name"] for lane in summary["lanes"]}
            covered = summary.get("covered") or list(matrix.lanes)
            selection.update({n: None for n in covered if n in matrix.lanes and n not in reached})
        return selection
    except (ValueError, KeyError, TypeError, AttributeError):
        # Any shape other than the one run_matrix writes (a hand edit, a cut-short copy).
        raise UsageError(
            f"--rerun-failed: {summary_file} is not a matrix summary; run the matrix again"
        ) from None


def _failed_lanes(lanes: list[dict[str, Any]], matrix: Matrix) -> dict[str, list[str] | None]:
    if not isinstance(lanes, list):
        raise TypeError("lanes is not a list")
    selection: dict[str, list[str] | None] = {}
    for lane in lanes:
        name = lane.get("name")
        if not isinstance(name, str):
            raise TypeError("a lane without a name")
        if name not in matrix.lanes:
            continue
        if lane.get("status") == "not-run":
            continue
        bad = [p for p in lane.get("problems", []) if p.get("bucket") in BAD_BUCKETS]
        if not bad:
            continue
        nodeids = [str(p["nodeid"]) for p in bad]
        whole = matrix.lanes[name].kind != "pytest" or any(
            "::" not in n and not n.endswith(".py") for n in nodeids
        )
        selection[name] = None if whole else list(dict.fromkeys(nodeids))
    return selection


def _check_outputs(json_path: Path | None, junit_dir: Path, out_dir: Path) -> None:
    problems = [("--out-dir", out_dir, outpaths.dir_problem(out_dir))]
    problems.append(("--junit-dir", junit_dir, outpaths.dir_problem(junit_dir)))
    if json_path is not None:
        problems.append(("--json", json_path, outpaths.file_problem(json_path)))
    for flag, path, problem in problems:
        if problem:
            raise UsageError(f"{flag} {outpaths.shown(path)}: {problem}")


def _required_lanes(matrix: Matrix, selected: list[Lane], require: list[str] | None) -> list[str]:
    """The lanes `--require` names (comma lists allowed), each known and selected."""
    required = [n.strip() for item in require or [] for n in item.split(",") if n.strip()]
    if require is not None and not required:
        raise UsageError(f"--require {','.join(require)!r}: name at least one lane")
    unknown = [n for n in required if n not in matrix.lanes]
    if unknown:
        raise UsageError(
            f"--require: unknown lane(s) {', '.join(unknown)}; known: {', '.join(matrix.lanes)}"
        )
    unselected = [n for n in required if n not in {lane.name for lane in selected}]
    if unselected:
        raise UsageError(
            f"--require {', '.join(unselected)}: not among the selected lanes; add it to --lane"
        )
    return required


def _check_workers(workers: int | None) -> None:
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)):
        raise UsageError(f"--workers {workers!r}: use a whole number >= 1")
    if workers is not None and workers < 1:
        raise UsageError(f"--workers {workers}: use a whole number >= 1")


def _run_lanes(
    selected: list[Lane],
    results: list[LaneResult],
    caps: dict[str, Any],
    caps_file: Path,
    matrix_file: Path,
    root: Path,
    out_dir: Path,
    junit_dir: Path,
    workers: int | None,
    rerun: dict[str, list[str] | None] | None,
    stream: TextIO,
    pytest_args: tuple[str, ...] = (),
) -> str | None:
    """Run each lane in turn, appending to `results`; the name of the lane a Ctrl-C/SIGTERM
    interrupted, or None."""
    for lane in selected:
        missing = lane.missing(caps)
        if missing:
            hint = enable_hint(missing)
            results.append(LaneResult(lane.name, "not-run", missing=missing, enable=hint))
            print(f"[matrix] {lane.name}: {_not_run_text(missing, hint)}", file=stream)
            continue
        subset = rerun.get(lane.name) if rerun else None
        print(
            f"[matrix] {lane.name}: running ({workers or lane.workers} worker(s))"
            + (f", {len(subset)} test(s) that failed last time" if subset else "")
            + " ...",
            file=stream,
            flush=True,
        )
        try:
            if lane.kind == "ruff":
                res = run_ruff_lane(lane, root, out_dir, junit_dir)
            else:
                res = run_pytest_lane(
                    lane,
                    matrix_file.resolve(),
                    root,
                    caps_file,
                    out_dir,
                    junit_dir,
                    workers,
                    stream=stream,
                    nodeids=subset,
                    pytest_args=pytest_args,
                )
        except KeyboardInterrupt:
            res = LaneResult(lane.name, "interrupted")
            res.add("infra-error", lane.name, "interrupted (Ctrl-C/SIGTERM)")
            _finish_junit(res, junit_dir / f"{lane.name}.xml")
        results.append(res)
        if res.status == "interrupted":
            return lane.name
    return None


def _fail_required_not_run(results: list[LaneResult], required: list[str], junit_dir: Path) -> None:
    """A required lane that could not run is an infra-error, never "not run"."""
    for name in required:
        res = next((r for r in results if r.name == name), None)
        if res is not None and res.status == "not-run":
            res.status = "ran"
            res.add(
                "infra-error",
                name,
                f"required lane cannot run here: missing {', '.join(res.missing)}"
                + (f"; enable: {res.enable}" if res.enable else ""),
            )
            _finish_junit(res, junit_dir / f"{name}.xml")


def _write_reports(
    results: list[LaneResult],
    code: int,
    caps: dict[str, Any] | None,
    platform_name: str,
    started: float,
    interrupted_lane: str | None,
    rerun_failed: bool,
    out_dir: Path,
    json_path: Path | None,
    json_to_stdout: bool,
    stream: TextIO,
    covered: list[str] | None = None,
    earlier: list[dict[str, Any]] | None = None,
) -> None:
    """summary.json (and --json), summary.md and $GITHUB_STEP_SUMMARY.

    `covered`: the lanes this run selected; `earlier`: what the previous summaries recorded for
    the other lanes (kept, so --rerun-failed still sees their failures)."""
    summary = {
        "platform": platform_name,
        "capabilities": caps,
        "started": started,
        "duration_s": time.time() - started,
        "exit_code": code,
        "interrupted": interrupted_lane is not None,
        "interrupted_lane": interrupted_lane,
        "rerun_failed": rerun_failed,
        "covered": list(covered if covered is not None else [r.name for r in results]),
        "lanes": [asdict(r) for r in results],
        "earlier_lanes": list(earlier or []),
    }
    text = json.dumps(summary, indent=2)
    _atomic_write(out_dir / "summary.json", text)
    if json_to_stdout:
        print(text, file=_PipeSafe(sys.stdout), flush=True)
    elif json_path is not None:
        _atomic_write(json_path, text)
    markdown = format_markdown(results, code, platform_name)
    _atomic_write(out_dir / "summary.md", markdown)
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        try:
            with open(step_summary, "a", encoding="utf-8") as fh:
                fh.write(markdown)
        except OSError as err:
            print(f"[matrix] cannot append to $GITHUB_STEP_SUMMARY: {err}", file=stream)


def _platform_caps(
    platform: str | None, caps: dict[str, Any] | None, matrix_file: Path
) -> tuple[dict[str, Any] | None, str]:
    """The capabilities to plan with and where they come from: a forced profile, the caller's,
    or (None) detected on this machine when the run starts."""
    if platform is not None:
        try:
            return profile(platform), platform
        except KeyError as err:
            raise MatrixError(str(matrix_file), 0, str(err.args[0])) from None
    if caps is not None:
        return caps, "given"  # callers that already know (tests, a wrapping tool)
    return None, "detected"


def _print_resume(
    results: list[LaneResult], selected: list[Lane], interrupted_lane: str, stream: TextIO
) -> None:
    done = [r.name for r in results if r.status == "ran"]
    remaining = [lane.name for lane in selected if lane.name not in done]
    print(
        f"[matrix] interrupted during {interrupted_lane}; finished: "
        f"{', '.join(done) or 'none'}; not finished: {', '.join(remaining)}. "
        f"Re-run to resume: invoke test --lane {','.join(remaining)}",
        file=stream,
    )


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
    rerun_failed: bool = False,
    pytest_args: list[str] | None = None,
) -> int:
    """Validate, plan, run, report. Returns the exit code (0 only when every ran lane is clean,
    130 when interrupted). Bad input raises MatrixError (the matrix file) or UsageError (flags)."""
    # `--json -`: standard output carries only the JSON summary; people read the rest on stderr.
    json_to_stdout = json_path is not None and str(json_path) == "-"
    stream = _PipeSafe(stream or (sys.stderr if json_to_stdout else sys.stdout))
    matrix = load(matrix_file)
    # A flag given with an empty value ("$UNSET") is a mistake, never "no selection": an empty
    # --require would let a lane CI exists to prove pass as "not run".
    if lanes is not None and not [n for item in lanes for n in item.split(",") if n.strip()]:
        raise UsageError(f"--lane {','.join(lanes)!r}: name at least one lane (--list shows them)")
    selected = select_lanes(matrix, lanes)
    required = _required_lanes(matrix, selected, require)
    _check_workers(workers)
    caps, platform_name = _platform_caps(platform, caps, matrix_file)
    if list_only or platform is not None:
        # A forced profile describes another machine: show what would happen there, run nothing.
        caps = caps if caps is not None else detect()
        print(format_plan(matrix, selected, caps, platform_name), file=stream)
        return 0
    out_dir = out_dir or root / "out" / "matrix"
    junit_dir = junit_dir or out_dir / "junit"
    _check_outputs(None if json_to_stdout else json_path, junit_dir, out_dir)
    if json_path is not None and Path(json_path).resolve() == Path(matrix_file).resolve():
        raise UsageError(f"--json {str(json_path)!r} is the matrix file; choose another path")
    with _exclusive(out_dir):
        rerun: dict[str, list[str] | None] | None = None
        if rerun_failed:
            rerun = failed_last_time(out_dir / "summary.json", matrix)
            selected = [lane for lane in selected if lane.name in rerun]
            if not selected:
                print("[matrix] nothing failed in the last run; nothing to rerun", file=stream)
                return 0
        # Results of lanes this run does not cover stay (files and summary entries): a run replaces
        # what it runs and nothing else. Cleared before detecting (seconds): a Ctrl-C there must not
        # leave the last run's summary of the lanes it covers.
        earlier = _earlier_lanes(out_dir / "summary.json", {lane.name for lane in selected})
        _clear_outputs(out_dir, junit_dir, [lane.name for lane in selected])
        results: list[LaneResult] = []
        started = time.time()
        interrupted_lane: str | None = None
        try:
            previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        except ValueError:  # not the main thread (an embedding tool): keep its handlers
            previous = None
        try:
            if caps is None:
                try:
                    caps = detect()
                except KeyboardInterrupt:  # still reported below: summary marked interrupted, 130
                    caps, interrupted_lane = {}, "(detecting capabilities)"
            caps_file = out_dir / "capabilities.json"
            _atomic_write(caps_file, json.dumps(caps, indent=2))
            if not interrupted_lane:
                interrupted_lane = _run_lanes(
                    selected, results, caps, caps_file, matrix_file, root, out_dir, junit_dir,
                    workers, rerun, stream, tuple(pytest_args or ()),
                )  # fmt: skip
        except KeyboardInterrupt:
            interrupted_lane = interrupted_lane or "(between lanes)"
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        if interrupted_lane is None:
            _fail_required_not_run(results, required, junit_dir)
        print(format_table(results), file=stream)
        problems = format_problems(results)
        if problems:
            print(problems, file=stream)
        if interrupted_lane is not None:
            _print_resume(results, selected, interrupted_lane, stream)
            code = INTERRUPTED
        else:
            code = 0 if all(r.ok for r in results) else 1
        _write_reports(
            results, code, caps, platform_name, started, interrupted_lane, rerun_failed,
            out_dir, json_path, json_to_stdout, stream,
            covered=[lane.name for lane in selected], earlier=earlier,
        )  # fmt: skip
        return code

"""PyTorch's own OpInfo database run on flagos against the CPU: the eager-parity peer suite.

Every op of `torch.testing._internal.common_methods_invocations.op_db` with float32 or
complex64 support runs its first samples (forward only) on flagos and on the CPU, and the
results must agree. Samples are made on flagos and copied to the CPU for the reference, as
PyTorch's own `test_compare_cpu` does, so host-side arguments a sample puts on the CPU on
purpose stay there. Where the CPU raises, the device must raise too.

Each op runs in a forked child, so a crash (a signal) or a hang is that op's failure and the
run goes on. `EXCLUSIONS` below is the only list of ops not compared value for value.

Run on its own for counts (what the lane runs is tests/eager/test_opinfo_peer.py):

    .venv/bin/python -m tests.eager.opinfo_peer --cap 2
"""

from __future__ import annotations

import argparse
import collections
import difflib
import json
import os
import select
import signal
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

import torch_fl  # noqa: F401 - registers the flagos device

DEV = torch.device("flagos")
DTYPES = (torch.float32, torch.complex64)
SAMPLES_PER_DTYPE = 2  # the lane's cap: keeps the suite within the lane's time budget
OP_TIMEOUT_S = 120.0

SHAPE_ONLY = "shape-only"
SKIP = "skip"

# The one list of ops not compared value for value, with the reason for each. "shape-only":
# the op runs on both devices and shape, dtype and device of its results are still checked.
EXCLUSIONS: dict[str, tuple[str, str]] = {
    "empty": (SHAPE_ONLY, "uninitialised memory: values are whatever the block held"),
    "empty_like": (SHAPE_ONLY, "uninitialised memory: values are whatever the block held"),
    "empty_strided": (SHAPE_ONLY, "uninitialised memory: values are whatever the block held"),
    "empty_permuted": (SHAPE_ONLY, "uninitialised memory: values are whatever the block held"),
    "new_empty": (SHAPE_ONLY, "uninitialised memory: values are whatever the block held"),
    "new_empty_strided": (SHAPE_ONLY, "uninitialised memory: values are whatever the block held"),
    "to_sparse": (SKIP, "sparse layout: flagos tensors are strided only"),
    "sparse.sampled_addmm": (SKIP, "sparse layout (CSR): flagos tensors are strided only"),
    "sparse.mm.reduce": (SKIP, "sparse layout (CSR): flagos tensors are strided only"),
}


def op_id(op: Any) -> str:
    """A unique name for an OpInfo entry: its name, plus its variant where it has one."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def load_ops() -> dict[str, Any]:
    """op id -> OpInfo, for every entry with float32 or complex64 support on the CPU."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
    ops = {}
    for op in op_db:
        supported = op.supported_dtypes("cpu")
        if any(dtype in supported for dtype in DTYPES):
            ops[op_id(op)] = op
    return ops


@dataclass
class OpReport:
    """What one op's samples did. `failures` holds one line per failed sample."""

    samples: int = 0
    passed: int = 0
    both_raised: int = 0
    failures: list[str] = field(default_factory=list)
    crash: str | None = None  # a signal or timeout of the child running the op

    @property
    def ok(self) -> bool:
        return not self.failures and self.crash is None


def _mirror_on_cpu(t: torch.Tensor) -> torch.Tensor:
    """`t` on the CPU with the same storage layout (whole storage, offset, strides), so ops that
    read past the view (as_strided of a partial view) and stride-dependent kernels see the same
    thing on both sides."""
    if t.device.type != DEV.type or t.layout != torch.strided or t.is_conj() or t.is_neg():
        return t.to("cpu")
    storage = t.untyped_storage().cpu()
    mirror = torch.empty(0, dtype=t.dtype)
    return mirror.set_(storage, t.storage_offset(), t.shape, t.stride())


def _to_cpu(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return _mirror_on_cpu(x)
    if isinstance(x, torch.device) and x.type == DEV.type:
        return torch.device("cpu")
    if isinstance(x, str) and x.split(":")[0] == DEV.type:
        return "cpu"
    return x


def _cpu_sample(sample: Any) -> tuple[Any, tuple, dict]:
    # `device=` of factory ops and device arguments of `to` move with the tensors.
    return (
        tree_map(_to_cpu, sample.input),
        tree_map(_to_cpu, tuple(sample.args)),
        tree_map(_to_cpu, dict(sample.kwargs)),
    )


def _compare(got: Any, want: Any, shape_only: bool) -> None:
    got_leaves, _ = tree_flatten(got)
    want_leaves, _ = tree_flatten(want)
    assert len(got_leaves) == len(want_leaves), f"{len(got_leaves)} vs {len(want_leaves)} outputs"
    for g, w in zip(got_leaves, want_leaves, strict=True):
        if isinstance(w, torch.Tensor):
            assert isinstance(g, torch.Tensor), f"expected a tensor, got {type(g).__name__}"
            if w.device.type == "cpu":
                assert g.device.type == DEV.type, f"result left the device: {g.device}"
            if shape_only:
                assert (g.shape, g.dtype) == (w.shape, w.dtype), (
                    g.shape,
                    g.dtype,
                    w.shape,
                    w.dtype,
                )
                continue
            torch.testing.assert_close(
                g.cpu(), w, equal_nan=True, check_device=False, check_stride=False
            )
        elif isinstance(w, float) and w != w:
            assert g != g, f"{g!r} != nan"
        else:
            assert g == w, f"{g!r} != {w!r}"


def _call(op: Any, inp: Any, args: tuple, kwargs: dict) -> Any:
    torch.manual_seed(0)  # seeds the CPU and the flagos generators alike: random ops compare too
    return op(inp, *args, **kwargs)


def run_op(op: Any, cap: int = SAMPLES_PER_DTYPE) -> OpReport:
    """Run `op`'s first `cap` samples per dtype on flagos and on the CPU; compare."""
    report = OpReport()
    shape_only = EXCLUSIONS.get(op_id(op), ("", ""))[0] == SHAPE_ONLY
    supported = op.supported_dtypes("cpu")
    for dtype in DTYPES:
        if dtype not in supported:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(0)
            samples = []
            for sample in op.sample_inputs(DEV.type, dtype, requires_grad=False):
                samples.append(sample)
                if len(samples) == cap:
                    break
            for i, sample in enumerate(samples):
                report.samples += 1
                _run_sample(op, sample, f"{dtype} sample {i}", shape_only, report)
    return report


def _run_sample(op: Any, sample: Any, where: str, shape_only: bool, report: OpReport) -> None:
    cpu_input, cpu_args, cpu_kwargs = _cpu_sample(sample)
    try:
        want = sample.output_process_fn_grad(_call(op, cpu_input, cpu_args, cpu_kwargs))
    except Exception as cpu_error:  # noqa: BLE001 - any CPU error: the device must raise too
        try:
            _call(op, sample.input, tuple(sample.args), dict(sample.kwargs))
        except Exception:  # noqa: BLE001
            report.both_raised += 1
            return
        report.failures.append(
            f"{where}: the CPU raised {type(cpu_error).__name__} but flagos returned a result"
        )
        return
    try:
        got = sample.output_process_fn_grad(
            _call(op, sample.input, tuple(sample.args), dict(sample.kwargs))
        )
    except Exception as error:  # noqa: BLE001
        first = (str(error).strip().splitlines() or [""])[0][:200]
        report.failures.append(f"{where}: flagos raised {type(error).__name__}: {first}")
        return
    try:
        _compare(got, want, shape_only)
    except AssertionError as mismatch:
        first = (str(mismatch).strip().splitlines() or [""])[0][:200]
        report.failures.append(f"{where}: wrong result: {first}")
        return
    report.passed += 1


def _child(ops: dict[str, Any], names: list[str], cap: int, pipe: int) -> None:
    """Runs in a forked child: each op in turn, announcing it before and reporting after."""
    # One thread: the child must not enter an OpenMP pool the parent may have started.
    torch.set_num_threads(1)
    with os.fdopen(pipe, "w", buffering=1) as out:
        for name in names:
            out.write(f"S {name}\n")
            try:
                payload = run_op(ops[name], cap).__dict__
            except BaseException as error:  # noqa: BLE001 - a harness error is the op's failure
                payload = {"crash": f"harness error: {type(error).__name__}: {error}"}
            out.write(f"D {json.dumps(payload)}\n")
    os._exit(0)


class _Worker:
    """A forked child working through a queue of ops; restarted after the op that killed it."""

    def __init__(self, ops: dict[str, Any], queue: list[str], cap: int) -> None:
        self.ops, self.queue, self.cap = ops, queue, cap
        self.next = 0  # index in queue of the first op not yet reported
        self.pid = -1
        self.pipe: Any = None
        self.current: str | None = None
        self.deadline = 0.0
        self.buffer = b""

    def start(self) -> bool:
        if self.next >= len(self.queue):
            return False
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            _child(self.ops, self.queue[self.next :], self.cap, write_end)
        os.close(write_end)
        self.pid, self.pipe, self.buffer, self.current = pid, os.fdopen(read_end, "rb"), b"", None
        return True

    def fileno(self) -> int:
        return self.pipe.fileno()

    def read(self, reports: dict[str, OpReport], timeout: float) -> bool:
        """Consume what the child wrote; False once it has exited (and been restarted if ops are
        left, in which case the caller keeps polling it)."""
        chunk = os.read(self.fileno(), 1 << 16)
        if chunk:
            self.buffer += chunk
            *lines, self.buffer = self.buffer.split(b"\n")
            for line in lines:
                kind, _, rest = line.decode().partition(" ")
                if kind == "S":
                    self.current, self.deadline = rest, time.monotonic() + timeout
                else:
                    report = OpReport()
                    report.__dict__.update(json.loads(rest))
                    reports[self.current] = report
                    self.current = None
                    self.next += 1
            return True
        self.pipe.close()
        _, status = os.waitpid(self.pid, 0)
        if self.current is not None:
            if os.WIFSIGNALED(status):
                why = f"the process died with {signal.Signals(os.WTERMSIG(status)).name}"
            else:
                why = f"the process exited with status {os.waitstatus_to_exitcode(status)}"
            reports[self.current] = OpReport(crash=why)
            self.next += 1
        return self.start()

    def kill_if_late(self, reports: dict[str, OpReport], timeout: float) -> bool:
        if self.current is None or time.monotonic() < self.deadline:
            return True
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        self.pipe.close()
        reports[self.current] = OpReport(crash=f"no result within {timeout:.0f} s (killed)")
        self.next += 1
        return self.start()


def run_isolated(
    ops: dict[str, Any],
    names: list[str],
    cap: int = SAMPLES_PER_DTYPE,
    workers: int = 2,
    timeout: float = OP_TIMEOUT_S,
) -> dict[str, OpReport]:
    """`run_op` for each name, in forked children: a crash or hang is that op's report, and the
    next op runs in a fresh child. `workers` children share the ops round-robin."""
    reports: dict[str, OpReport] = {}
    running = []
    for i in range(max(1, workers)):
        worker = _Worker(ops, names[i :: max(1, workers)], cap)
        if worker.start():
            running.append(worker)
    while running:
        ready, _, _ = select.select(running, [], [], 1.0)
        for worker in ready:
            if not worker.read(reports, timeout):
                running.remove(worker)
        for worker in list(running):
            if worker not in ready and not worker.kill_if_late(reports, timeout):
                running.remove(worker)
    return reports


def totals(reports: dict[str, OpReport]) -> str:
    """One line of counts over `reports`."""
    samples = sum(r.samples for r in reports.values())
    passed = sum(r.passed for r in reports.values())
    both = sum(r.both_raised for r in reports.values())
    crashed = sum(1 for r in reports.values() if r.crash)
    failed = sum(1 for r in reports.values() if r.failures)
    return (
        f"{len(reports)} ops run, {samples} samples: {passed} match the CPU, {both} raise on "
        f"both, {samples - passed - both} differ; {crashed} ops crashed, {failed} ops failed"
    )


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cap", type=_positive, default=SAMPLES_PER_DTYPE, help="samples per dtype"
    )
    parser.add_argument("--only", nargs="*", help="op ids to run (default: all)")
    parser.add_argument("--workers", type=_positive, default=2, help="children running ops at once")
    args = parser.parse_args(argv)
    start = time.monotonic()
    ops = load_ops()
    names = args.only or sorted(ops)
    unknown = [name for name in names if name not in ops]
    if unknown:
        hints = {n: difflib.get_close_matches(n, ops, n=3) for n in unknown}
        parser.error(
            "no float32/complex64 OpInfo entry named "
            + ", ".join(
                f"{n!r} (did you mean {', '.join(h) or 'nothing close'}?)" for n, h in hints.items()
            )
        )
    counts: collections.Counter[str] = collections.Counter()
    to_run = [name for name in names if EXCLUSIONS.get(name, ("", ""))[0] != SKIP]
    counts["ops skipped"] = len(names) - len(to_run)
    reports = run_isolated(ops, to_run, args.cap, args.workers)
    for name in to_run:
        report = reports[name]
        counts["ops"] += 1
        counts["samples"] += report.samples
        counts["samples passed"] += report.passed
        counts["samples raising on both"] += report.both_raised
        if report.crash:
            counts["ops crashed"] += 1
            print(f"CRASH {name}: {report.crash}", flush=True)
        if report.failures:
            counts["ops failed"] += 1
            counts["samples failed"] += len(report.failures)
            for line in report.failures:
                print(f"FAIL {name}: {line}", flush=True)
    print(" | ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    print(f"wall time {time.monotonic() - start:.1f} s (cap {args.cap} samples per dtype)")
    return 0 if not (counts["ops crashed"] or counts["ops failed"]) else 1


if __name__ == "__main__":
    sys.exit(main())

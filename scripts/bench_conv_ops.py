"""The sim's conv ops against ONNX Runtime's own QLinearConv, per conv shape.

Each row is one conv of a public network as a one-node channels-last QLinearConv session (an
NCHW stem with the Transpose ORT puts before it) and the same node rewritten to the extension's
op in its fastest form here, both on one thread, timed in turns (median microseconds of blocks
of ten calls, ONNX Runtime's per-call overhead in both):

- `depthwise`: the depthwise convs of MobileNetV3-Small and -Large, MobileNetV2 and
  EfficientNet-B0 (channels, input size, kernel, stride) on DepthwiseConv
  (`torch_fl._C._depthwise_kernel()`); the sim moves those whose channel count is not a multiple
  of `ALIGNED_CHANNELS` (conversion/depthwise.py);
- `narrow`: image stems from 3 channels at 224x224 (MobileNetV3's to 16, MobileNetV2's and
  EfficientNet's to 32, ResNet's 7x7 to 64) on NarrowConv (`_narrow_kernel()`); the sim moves
  those within its form's `MAX_OUTPUTS_BY_FORM` (conversion/narrow_op.py).

It prints whether the op's bytes equal ORT's (where ORT's u8s8 kernels saturate, on CPUs without
VNNI, against the same integers through its exact u8u8 ones: tests/support/sim_ops) and whether
the sim moves that conv. `--cpu-kind avx2` runs it as an AVX2-only CPU, emulated
(scripts/cpu_kind.py). The numbers in docs/compile.md come from it.

    python scripts/bench_conv_ops.py [--iters 100] [--cpu-kind avx2] [--json out/bench_conv_ops.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto  # noqa: E402

from provision.floor.outpaths import file_problem  # noqa: E402
from scripts import cpu_kind  # noqa: E402
from tests.support.sim_ops import (  # noqa: E402
    depthwise_qlinearconv,
    exact_reference,
    narrow_qlinearconv,
    op_session,
    random_input,
)
from torch_fl.bpu.conversion.depthwise import rewrite_depthwise  # noqa: E402
from torch_fl.bpu.conversion.narrow_op import MAX_OUTPUTS_BY_FORM, rewrite_narrow  # noqa: E402

DEPTHWISE = (
    # (batch, input height = width, channels, kernel, stride): public networks' depthwise convs
    (1, 112, 16, 3, 2),  # MobileNetV3-Small
    (1, 56, 72, 3, 2),
    (1, 28, 88, 3, 1),
    (1, 28, 96, 5, 2),
    (1, 14, 240, 5, 1),
    (1, 14, 120, 5, 1),
    (1, 14, 144, 5, 1),
    (1, 14, 288, 5, 2),
    (1, 7, 576, 5, 1),
    (1, 112, 32, 3, 1),  # MobileNetV2 / EfficientNet-B0
    (1, 56, 144, 3, 1),
    (1, 28, 192, 3, 1),
    (1, 14, 384, 3, 1),
    (1, 56, 72, 5, 2),  # MobileNetV3-Large
    (1, 28, 120, 5, 1),
    (1, 14, 480, 3, 1),
    (1, 14, 672, 5, 1),
    (8, 28, 88, 3, 1),  # batch 8
)
NARROW = (
    # (batch, input height = width, output channels, kernel, stride): stems from 3 channels
    (1, 224, 16, 3, 2),  # MobileNetV3
    (1, 224, 32, 3, 2),  # MobileNetV2, EfficientNet-B0
    (1, 224, 64, 7, 2),  # ResNet
    (8, 224, 16, 3, 2),  # batch 8
)
SHAPES = [("depthwise", s) for s in DEPTHWISE] + [("narrow", s) for s in NARROW]
"""Every row: (op, shape)."""


def _median_us(run, iters: int) -> float:
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _models(op: str, shape: tuple[int, ...], rng: np.random.Generator) -> tuple:
    """(ORT's one-node model, the op's, the input's shape) for one row."""
    n, size, channels, k, stride = shape
    pad = (k // 2,) * 4
    if op == "depthwise":
        dims = (n, size, size, channels)
        model = depthwise_qlinearconv(rng, dims, (k, k), (stride, stride), (1, 1), pad)
        rewrite = lambda m: rewrite_depthwise(m, form=0, every_width=True)  # noqa: E731
    else:
        dims = (n, 3, size, size)
        model = narrow_qlinearconv(rng, dims, channels, (k, k), (stride, stride), pads=pad,
                                   nchw=True)  # fmt: skip
        rewrite = lambda m: rewrite_narrow(m, form=0)  # noqa: E731
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    if rewrite(rewritten) != 1:
        raise RuntimeError(f"the {op} rewrite did not take the {shape} conv")
    return model, rewritten, dims


def _moved(op: str, model: onnx.ModelProto, form: str) -> bool:
    """Whether the sim runs this conv on the op where the op's form is `form`: the executor's
    own rewrite, with its limits (runtime/executors.py), on a copy of `model`."""
    if form == "portable":
        return False
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    if op == "depthwise":
        return rewrite_depthwise(copy) == 1
    return rewrite_narrow(copy, max_outputs=MAX_OUTPUTS_BY_FORM.get(form, 0)) == 1


def measure(op: str, shape: tuple[int, int, int, int, int], iters: int, form: str) -> dict:
    """One conv: ORT's QLinearConv and the op (in `form`), timed in turns of ten calls."""
    n, size, channels, k, stride = shape
    rng = np.random.default_rng(channels * 1000 + size * 10 + k)
    model, rewritten, dims = _models(op, shape, rng)
    x = {"x": random_input(rng, dims, TensorProto.UINT8)}
    ort_session, ours = op_session(model), op_session(rewritten)
    want = op_session(exact_reference(model)).run(None, x)[0]
    equal = bool(np.array_equal(want, ours.run(None, x)[0]))
    times: dict[str, list[float]] = {"ort": [], "op": []}
    for _ in range(max(1, iters // 10)):
        for name, session in (("ort", ort_session), ("op", ours)):
            times[name].append(_median_us(lambda s=session: s.run(None, x), 10))
    ort_us, op_us = statistics.median(times["ort"]), statistics.median(times["op"])
    moved = _moved(op, model, form)
    return {
        "op": op, "batch": n, "size": size, "channels": channels, "kernel": k, "stride": stride,
        "ort_us": round(ort_us, 1), "op_us": round(op_us, 1),
        "ort_over_op": round(ort_us / op_us, 3), "equal": equal, "moved": moved,
    }  # fmt: skip


def _rows(iters: int, forms: dict[str, str]) -> list[dict]:
    """Every row of SHAPES, printed as it is measured; then the moved convs' mean gain."""
    rows = []
    for op, shape in SHAPES:
        row = measure(op, shape, iters, forms[op])
        rows.append(row)
        print(
            f"{op:9} {row['batch']:>2} {row['size']:>3}x{row['size']:<3} {row['channels']:>4} "
            f"{row['kernel']:>3} {row['stride']:>2} {row['ort_us']:>8.1f} {row['op_us']:>8.1f} "
            f"{row['ort_over_op']:>7.2f}  {str(row['equal']):5}  {row['moved']}",
            flush=True,
        )
    for op in forms:
        moved = [r["ort_over_op"] for r in rows if r["op"] == op and r["moved"]]
        if moved:
            mean = statistics.geometric_mean(moved)
            print(f"{op}: {len(moved)} moved, geometric mean ORT / op {mean:.2f}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=200, help="calls of each session per row")
    parser.add_argument(
        "--cpu-kind", default="native", choices=["native", *cpu_kind.KINDS],
        help="run as this CPU kind: avx2 emulates an AVX2-only CPU here (scripts/cpu_kind.py)",
    )  # fmt: skip
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    if args.iters < 10:
        parser.error("--iters must be at least 10 (one block of ten calls)")
    problem = file_problem(Path(args.json)) if args.json is not None else None
    if problem:  # before minutes of timing, not after
        parser.error(f"--json {args.json!r} {problem}")
    argv_now = sys.argv[1:] if argv is None else argv
    code, _ = cpu_kind.enter(args.cpu_kind, __file__, argv_now, parser, "bench_conv_ops")
    if code is not None:  # the benchmark ran again, as that CPU kind
        return code
    from torch_fl import _C

    forms = {"depthwise": _C._depthwise_kernel(), "narrow": _C._narrow_kernel()}
    print(f"the ops' forms here: {forms}; 1 thread, median us of {args.iters} calls each")
    print(f"{'op':9} {'N':>2} {'HxW':>7} {'C':>4} {'k':>3} {'s':>2} {'ORT us':>8} {'op us':>8} "
          f"{'ORT/op':>7}  equal  moved")  # fmt: skip
    try:
        rows = _rows(args.iters, forms)
    except KeyboardInterrupt:  # nothing written: the JSON is written whole, at the end
        print("bench_conv_ops: interrupted", file=sys.stderr)
        return 130
    if not all(r["equal"] for r in rows):
        print("bench_conv_ops: the op's bytes differ from ORT's", file=sys.stderr)
        return 1
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        doc = {"cpu_kind": args.cpu_kind, "forms": forms, "iters": args.iters, "rows": rows}
        tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, out)  # atomic: a Ctrl-C never leaves half a file
    return 0


if __name__ == "__main__":
    sys.exit(main())

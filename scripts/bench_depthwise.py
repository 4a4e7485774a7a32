"""The sim's depthwise int8 conv op against ONNX Runtime's own QLinearConv, per conv shape.

Each row is one depthwise conv of a public network (MobileNetV3-Small and -Large, MobileNetV2,
EfficientNet-B0: channels, input size, kernel, stride), as a one-node channels-last QLinearConv
session and the same node rewritten to the extension's DepthwiseConv op in its fastest form here
(`torch_fl._C._depthwise_kernel()`), both on one thread, timed in turns (median microseconds of
`--iters` calls each, ONNX Runtime's per-call overhead included in both). It prints whether the
op's bytes equal ORT's and whether the sim moves that conv (conversion/depthwise.py: channel
counts not a multiple of `ALIGNED_CHANNELS`). `--cpu-kind avx2` runs it as an AVX2-only CPU,
emulated (scripts/cpu_kind.py). The numbers in docs/compile.md come from it.

    python scripts/bench_depthwise.py [--iters 200] [--cpu-kind avx2] [--json out/bench_depthwise.json]
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

from scripts import cpu_kind  # noqa: E402
from tests.support.sim_ops import depthwise_qlinearconv, op_session, random_input  # noqa: E402
from torch_fl.bpu.conversion.depthwise import ALIGNED_CHANNELS, rewrite_depthwise  # noqa: E402

SHAPES = (
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


def _median_us(run, iters: int) -> float:
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def measure(shape: tuple[int, int, int, int, int], iters: int) -> dict:
    """One conv shape: ORT's QLinearConv and the op, timed in turns of blocks of ten calls."""
    n, size, channels, k, stride = shape
    rng = np.random.default_rng(channels * 1000 + size * 10 + k)
    nhwc = (n, size, size, channels)
    pad = k // 2
    model = depthwise_qlinearconv(rng, nhwc, (k, k), (stride, stride), (1, 1), (pad,) * 4)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    if rewrite_depthwise(rewritten, form=0, every_width=True) != 1:
        raise RuntimeError(f"the rewrite did not take the {shape} conv")
    x = {"x": random_input(rng, nhwc, TensorProto.UINT8)}
    ort_session, op = op_session(model), op_session(rewritten)
    equal = bool(np.array_equal(ort_session.run(None, x)[0], op.run(None, x)[0]))
    times: dict[str, list[float]] = {"ort": [], "op": []}
    for _ in range(max(1, iters // 10)):
        for name, session in (("ort", ort_session), ("op", op)):
            times[name].append(_median_us(lambda s=session: s.run(None, x), 10))
    ort_us, op_us = statistics.median(times["ort"]), statistics.median(times["op"])
    return {
        "batch": n, "size": size, "channels": channels, "kernel": k, "stride": stride,
        "ort_us": round(ort_us, 1), "op_us": round(op_us, 1),
        "ort_over_op": round(ort_us / op_us, 3), "equal": equal,
        "moved": channels % ALIGNED_CHANNELS != 0,
    }  # fmt: skip


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
    if args.cpu_kind != "native":
        try:
            code = cpu_kind.rerun_as(
                args.cpu_kind, __file__, sys.argv[1:] if argv is None else argv, "bench_depthwise"
            )
        except ValueError as exc:
            parser.error(f"--cpu-kind {args.cpu_kind}: {exc}")
        if code is not None:
            return code
        try:
            print(f"CPU kind: {cpu_kind.check(args.cpu_kind)}")
        except RuntimeError as exc:
            raise SystemExit(f"bench_depthwise: --cpu-kind {args.cpu_kind}: {exc}") from None
    from torch_fl import _C

    form = _C._depthwise_kernel()
    print(f"the op's form here: {form}; 1 thread, median us of {args.iters} calls each")
    print(f"{'N':>2} {'HxW':>7} {'C':>4} {'k':>3} {'s':>2} {'ORT us':>8} {'op us':>8} "
          f"{'ORT/op':>7}  equal  moved")  # fmt: skip
    rows = []
    for shape in SHAPES:
        row = measure(shape, args.iters)
        rows.append(row)
        print(
            f"{row['batch']:>2} {row['size']:>3}x{row['size']:<3} {row['channels']:>4} "
            f"{row['kernel']:>3} {row['stride']:>2} {row['ort_us']:>8.1f} {row['op_us']:>8.1f} "
            f"{row['ort_over_op']:>7.2f}  {str(row['equal']):5}  {row['moved']}",
            flush=True,
        )
    moved = [r for r in rows if r["moved"]]
    if moved:
        ratio = statistics.geometric_mean(r["ort_over_op"] for r in moved)
        print(f"moved convs: {len(moved)}, geometric mean ORT / op {ratio:.2f}")
    if not all(r["equal"] for r in rows):
        print("bench_depthwise: the op's bytes differ from ORT's", file=sys.stderr)
        return 1
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        doc = {"cpu_kind": args.cpu_kind, "form": form, "iters": args.iters, "rows": rows}
        tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, out)  # atomic: a Ctrl-C never leaves half a file
    return 0


if __name__ == "__main__":
    sys.exit(main())

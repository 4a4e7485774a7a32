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
  those within its form's `MAX_OUTPUTS_BY_FORM` (conversion/narrow_op.py);
- `pointwise` and `gemm`: MobileNetV3-Small's 1x1 convs and ViT-S/16's and the 4-layer
  encoder's GEMMs with uint8 weights (ORT's exact u8u8 kernels, as the sim's `mixed` path writes
  them) on PairGemm (`_pair_gemm_kernel()`); the sim moves them where its kernels are the u8u8
  ones (no VNNI: conversion/pair_gemm.py). These rows also time ORT's u8s8 kernel on the same
  integers as int8 weights (`u8s8_us`): ORT's own int8 speed, which without VNNI adds its
  products in saturating int16 pairs (its bytes are then not the exact ones).

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
from onnx import TensorProto, numpy_helper  # noqa: E402

from provision.floor.outpaths import file_problem  # noqa: E402
from scripts import cpu_kind  # noqa: E402
from tests.support.sim_ops import (  # noqa: E402
    depthwise_qlinearconv,
    exact_reference,
    narrow_qlinearconv,
    op_session,
    qgemm,
    random_input,
)
from torch_fl.bpu.conversion.depthwise import rewrite_depthwise  # noqa: E402
from torch_fl.bpu.conversion.narrow_op import MAX_OUTPUTS_BY_FORM, rewrite_narrow  # noqa: E402
from torch_fl.bpu.conversion.pair_gemm import rewrite_pair_gemm  # noqa: E402
from torch_fl.bpu.runtime import sim_kernels  # noqa: E402
from torch_fl.bpu.runtime.executors import takes_pair_gemms  # noqa: E402

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
POINTWISE = (
    # (batch, input height = width, input channels, output channels): 1x1 convs
    (1, 56, 16, 72),  # MobileNetV3-Small
    (1, 28, 72, 24),
    (1, 14, 40, 240),
    (1, 14, 240, 40),
    (1, 7, 96, 576),
    (1, 7, 576, 96),
    (8, 56, 16, 72),  # batch 8
)
GEMMS = (
    # (rows of A, K, N)
    (197, 384, 1152),  # ViT-S/16 at batch 1: attention's in-projection, then the MLP
    (197, 384, 1536),
    (197, 1536, 384),
    (128, 256, 768),  # the 4-layer encoder (d = 256, 128 tokens) at batch 1
    (1024, 256, 768),  # and at batch 8
)
SHAPES = (
    [("depthwise", s) for s in DEPTHWISE] + [("narrow", s) for s in NARROW]
    + [("pointwise", s) for s in POINTWISE] + [("gemm", s) for s in GEMMS]
)  # fmt: skip
"""Every row: (op, shape)."""
PAIRS = ("pointwise", "gemm")
"""The rows of the PairGemm op, with ORT's u8s8 timed too."""


def _median_us(run, iters: int) -> float:
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _signed(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (one QLinearConv or QGemm with uint8 weights, zero point 128) with the same
    integers as int8 weights of zero point 0: ORT's u8s8 kernels."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    node = copy.graph.node[-1]
    inits = {i.name: i for i in copy.graph.initializer}
    for name in (node.input[3], node.input[5]):  # weights, their zero points
        values = numpy_helper.to_array(inits[name]).astype(np.int16) - 128
        inits[name].CopyFrom(numpy_helper.from_array(values.astype(np.int8), name))
    return copy


def _models(op: str, shape: tuple[int, ...], rng: np.random.Generator) -> tuple:
    """(ORT's one-node model, the op's, the input's shape) for one row."""
    if op in PAIRS:
        if op == "pointwise":
            n, size, channels, outputs = shape
            dims = (n, size, size, channels)
            model = narrow_qlinearconv(rng, dims, outputs, (1, 1), pads=(0, 0, 0, 0),
                                       w_type=TensorProto.UINT8)  # fmt: skip
        else:
            rows, k, n = shape
            dims = (rows, k)
            model = qgemm(rng, k, n, rows=rows, w_type=TensorProto.UINT8, float_out=False)
        rewritten = onnx.ModelProto()
        rewritten.CopyFrom(model)
        if rewrite_pair_gemm(rewritten) != 1:
            raise RuntimeError(f"the {op} rewrite did not take the {shape} node")
        return model, rewritten, dims
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
    if op in PAIRS:  # the executor's own condition, for its default kernel path here
        return takes_pair_gemms(sim_kernels.choose("auto").path)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    if op == "depthwise":
        return rewrite_depthwise(copy) == 1
    return rewrite_narrow(copy, max_outputs=MAX_OUTPUTS_BY_FORM.get(form, 0)) == 1


def _shape_keys(op: str, shape: tuple[int, ...]) -> dict:
    """A row's shape as named fields."""
    if op == "gemm":
        return dict(zip(("rows", "k", "n"), shape, strict=True))
    if op == "pointwise":
        return dict(zip(("batch", "size", "channels", "outputs"), shape, strict=True))
    return dict(zip(("batch", "size", "channels", "kernel", "stride"), shape, strict=True))


def _label(row: dict) -> str:
    if row["op"] == "gemm":
        return f"{row['rows']:>5} x {row['k']:>4} @ {row['k']:>4} x {row['n']:<5}"
    if row["op"] == "pointwise":
        return (f"{row['batch']:>2} {row['size']:>3}x{row['size']:<3} 1x1 "
                f"{row['channels']:>4} -> {row['outputs']:<4}")  # fmt: skip
    return (f"{row['batch']:>2} {row['size']:>3}x{row['size']:<3} {row['kernel']}x{row['kernel']} "
            f"c{row['channels']:<4} s{row['stride']}  ")  # fmt: skip


def measure(op: str, shape: tuple[int, ...], iters: int, form: str) -> dict:
    """One conv or GEMM: ORT's own node and the op (in `form`), timed in turns of ten calls
    (the PairGemm rows also ORT's u8s8 kernel on the same integers)."""
    if op in PAIRS:
        rng = np.random.default_rng(sum(v * 10**i for i, v in enumerate(shape)))
    else:
        n, size, channels, k, stride = shape
        rng = np.random.default_rng(channels * 1000 + size * 10 + k)
    model, rewritten, dims = _models(op, shape, rng)
    x = {"x": random_input(rng, dims, TensorProto.UINT8)}
    sessions = {"ort": op_session(model), "op": op_session(rewritten)}
    if op in PAIRS:
        sessions["u8s8"] = op_session(_signed(model))
    want = op_session(exact_reference(model)).run(None, x)[0]
    equal = bool(np.array_equal(want, sessions["op"].run(None, x)[0]))
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(max(1, iters // 10)):
        for name, session in sessions.items():
            times[name].append(_median_us(lambda s=session: s.run(None, x), 10))
    us = {name: statistics.median(t) for name, t in times.items()}
    row = {
        "op": op, **_shape_keys(op, shape),
        "ort_us": round(us["ort"], 1), "op_us": round(us["op"], 1),
        "ort_over_op": round(us["ort"] / us["op"], 3), "equal": equal,
        "moved": _moved(op, model, form),
    }  # fmt: skip
    if "u8s8" in us:
        row["u8s8_us"] = round(us["u8s8"], 1)
        row["u8s8_over_op"] = round(us["u8s8"] / us["op"], 3)
    return row


def _rows(iters: int, forms: dict[str, str]) -> list[dict]:
    """Every row of SHAPES, printed as it is measured; then the moved convs' mean gain."""
    rows = []
    for op, shape in SHAPES:
        row = measure(op, shape, iters, forms[op])
        rows.append(row)
        u8s8 = f"{row['u8s8_us']:>9.1f}" if "u8s8_us" in row else f"{'':>9}"
        print(
            f"{op:9} {_label(row):32} {row['ort_us']:>9.1f} {row['op_us']:>9.1f} "
            f"{row['ort_over_op']:>7.2f} {u8s8}  {str(row['equal']):5}  {row['moved']}",
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

    pairs = _C._pair_gemm_kernel()
    forms = {"depthwise": _C._depthwise_kernel(), "narrow": _C._narrow_kernel(),
             "pointwise": pairs, "gemm": pairs}  # fmt: skip
    print(f"the ops' forms here: {forms}; 1 thread, median us of {args.iters} calls each")
    print(f"{'op':9} {'shape':32} {'ORT us':>9} {'op us':>9} {'ORT/op':>7} {'u8s8 us':>9}  "
          "equal  moved")  # fmt: skip
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

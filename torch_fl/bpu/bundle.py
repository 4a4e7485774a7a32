"""A compiled model as a deployable bundle: `export(model, *inputs, path=...)`, `load(path)`.

A bundle is one folder a board can run with no torch installed:

    model.onnx     the int8 Q/DQ graph with the weights baked in (what hbdk4 compiles)
    model.hbm      the compiled BPU program, where hbdk4 exists here (else a note says how)
    manifest.json  inputs/outputs (names, shapes, dtypes, activation scales), every scale, the
                   march, the toolchain versions, the model's name, the sha256 of every file
    run.py         a copy of bundle_run.py: numpy + hbm_runtime (board) or onnxruntime (host)

The model must be one BPU partition from input to output: a bundle carries no torch glue, so a
model with ops left on the CPU is refused with their names (explain() shows them). The bundle is
written into a temporary folder beside `path` and renamed into place: an interrupted export
leaves nothing half-written, and an existing bundle is replaced only with overwrite=True.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from torch_fl.atomic import sha256_file
from torch_fl.bpu.bundle_run import FORMAT, MANIFEST, BundleError
from torch_fl.bpu.bundle_run import load as load_runner
from torch_fl.bpu.errors import ExportError
from torch_fl.bpu.report import ran as graphs_ran
from torch_fl.bpu.runtime import partition as runtime
from torch_fl.host_view import cpu_views

MODEL_ONNX, MODEL_HBM, RUNNER = "model.onnx", "model.hbm", "run.py"
# The runner ships as a copy of its own source file, which sits beside this one.
_RUNNER_SOURCE = Path(__file__).with_name("bundle_run.py")


class _Recorder:
    """Stands in for a calibration session: each partition call records its inputs and runs
    eagerly (partition.py's slow path), so export sees what reaches each partition."""

    def __init__(self) -> None:
        self.calls: list[tuple[runtime.PartitionRuntime, tuple]] = []

    def observe(self, part: runtime.PartitionRuntime, args: Sequence[torch.Tensor]) -> None:
        self.calls.append((part, tuple(args)))


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    raise ExportError(f"export: the model returns a {type(value).__name__}; a bundle takes "
                      "tensors, or tuples/lists/dicts of them")  # fmt: skip


def _versions(compiler_id: str) -> dict[str, str]:
    from importlib import metadata

    import onnx
    import onnxruntime

    try:
        ours = metadata.version("torch-fl-bpu")
    except metadata.PackageNotFoundError:  # a source checkout that was never pip-installed
        ours = "source checkout"
    return {
        "torch_fl": ours,
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "compiler": compiler_id,
    }


def _trace(model: torch.nn.Module, inputs: tuple, options: dict, samples) -> tuple:
    """Compile `model`, calibrate it on `samples` (if given), and run `inputs` recording what
    reaches each partition. Returns (recorded calls, model outputs, graph reports)."""
    from torch_fl.bpu.calibrate import calibrate

    torch._dynamo.reset()
    compiled = torch.compile(model, backend="bpu", options=options)
    if samples is not None:
        calibrate(compiled, samples)
    recorder = _Recorder()
    token = runtime.CALIBRATION.set(recorder)
    try:
        with torch.no_grad(), graphs_ran() as graphs:
            out = compiled(*inputs)
    finally:
        runtime.CALIBRATION.reset(token)
    return recorder.calls, out, graphs


def _one_partition(calls, out, graphs, inputs: tuple):
    """The single partition that maps the model's inputs to its outputs, or ExportError."""
    cpu = sorted({n["target"] for g in graphs for n in g.cpu_nodes})
    parts = {id(p): p for p, _ in calls}
    if len(graphs) != 1 or len(parts) != 1 or len(calls) != 1 or cpu:
        found = f"{len(graphs)} graph(s), {len(parts)} partition(s)"
        raise ExportError(
            f"export: a bundle runs the whole model as one BPU partition; this model compiles "
            f"to {found}" + (f", with ops on the CPU: {', '.join(cpu)}" if cpu else "") + ". "
            "Fix: torch_fl.bpu.explain(model, *inputs) shows why each op stays on the CPU"
        )
    part, args = calls[0]
    order = []
    for arg in (args[p] for p in part.spec.runtime_positions):
        found = _find(arg, inputs)
        if found is None:
            raise ExportError(
                "export: the partition reads a tensor computed from the inputs on the host "
                "(a reshape or a cast before the first BPU op); a bundle feeds the model's "
                "inputs straight to the BPU. Fix: move that step out of the model"
            )
        order.append(found)
    with torch.no_grad():
        part_out = part.eager(*args)
    part_out = list(part_out) if isinstance(part_out, (tuple, list)) else [part_out]
    positions = []
    for t in _tensors(out):
        found = _find(t, part_out)
        if found is None:
            raise ExportError(
                "export: a model output is computed on the host after the BPU partition (a "
                "view, a slice or a dtype change). Fix: return the partition's result as it is"
            )
        positions.append(found)
    return part, args, order, [(p, part_out[p]) for p in positions]


def _find(tensor: torch.Tensor, candidates) -> int | None:
    """Where `tensor` is among `candidates`: the same object, else the same shape, dtype and
    values (first match); None if nowhere."""
    for i, c in enumerate(candidates):
        if c is tensor:
            return i
    for i, c in enumerate(candidates):
        if c.shape == tensor.shape and c.dtype == tensor.dtype and torch.equal(c, tensor):
            return i
    return None


def _argument_names(model: torch.nn.Module, count: int) -> list[str]:
    """The forward() parameter names of the first `count` arguments (input_<i> where unnamed)."""
    import inspect

    try:
        params = [
            p.name for p in inspect.signature(model.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]  # fmt: skip
    except (TypeError, ValueError):
        params = []
    names = [params[i] if i < len(params) else f"input_{i}" for i in range(count)]
    return names if len(set(names)) == count else [f"input_{i}" for i in range(count)]


def _manifest(part, args, order, outputs, renames, name, compiler_id, hbm: bool) -> dict:
    """`outputs`: (partition output index, its tensor) per model output, in the model's order."""
    spec = part.spec
    scales = dict(part.scales or {})
    runtime_args = [args[p] for p in spec.runtime_positions]
    ins = [
        {
            "name": renames[onnx_name],
            "tensor": onnx_name,
            "argument": order[i],
            "shape": list(t.shape),
            "dtype": str(t.dtype).removeprefix("torch."),
            "scale": scales.get(onnx_name),
        }
        for i, (onnx_name, t) in enumerate(zip(spec.input_names, runtime_args, strict=True))
    ]
    outs = [
        {
            "name": spec.output_names[p],
            "tensor": spec.output_names[p],
            "shape": list(t.shape),
            "dtype": str(t.dtype).removeprefix("torch."),
        }
        for p, t in outputs
    ]
    manifest = {
        "format": FORMAT,
        "model": name,
        "march": part.settings.march,
        "inputs": ins,
        "outputs": outs,
        "quantization": {
            "scheme": "int8 symmetric activations (zero point 0), per-channel int8 weights",
            "activation_scales": scales,
            "calibration": part.entry.calibration,
        },
        "toolchain": _versions(compiler_id),
        "onnx": MODEL_ONNX,
        "hbm": MODEL_HBM if hbm else None,
    }
    if not hbm:
        manifest["note"] = (
            "no hbdk4 here: model.onnx is the int8 graph the board would compile. Compile it on "
            "an x86_64 host with hbdk4 (invoke compile-host) or export there; run.py runs it "
            "with onnxruntime meanwhile"
        )
    return manifest


def _place(tmp: Path, dest: Path, overwrite: bool) -> None:
    """Move the finished bundle `tmp` to `dest` (replacing an old bundle only if allowed)."""
    if not dest.exists():
        os.replace(tmp, dest)
        return
    if not (dest / MANIFEST).is_file():
        raise ExportError(f"export: {dest} exists and is not a bundle; nothing was written. "
                          "Fix: choose a new path")  # fmt: skip
    if not overwrite:
        raise ExportError(f"export: {dest} holds a bundle already; nothing was written. Fix: "
                          "overwrite=True, or another path")  # fmt: skip
    old = dest.with_name(f".{dest.name}.old-{secrets.token_hex(4)}")
    os.replace(dest, old)
    try:
        os.replace(tmp, dest)
    except BaseException:
        os.replace(old, dest)
        raise
    shutil.rmtree(old, ignore_errors=True)


def export(
    model: torch.nn.Module,
    *example_inputs: torch.Tensor,
    path: str | os.PathLike[str],
    samples: Iterable[Any] | None = None,
    options: dict[str, Any] | None = None,
    name: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write `model` (an nn.Module in eval mode, or its torch.compile'd form) as a bundle at
    `path` for inputs shaped like `example_inputs`.

    Scales come from `samples` (calibrated here) or from a calibration already made of these
    weights (bpu.calibrate, kept in the calibration store); with neither, CalibrationError says
    so. `options` are backend options (march, opt_level, ...). Returns the bundle's path."""
    if not isinstance(model, torch.nn.Module):
        raise ExportError(f"export: model must be a torch.nn.Module, not {type(model).__name__}")
    model = getattr(model, "_orig_mod", model)  # a torch.compile'd module: export what it wraps
    if not example_inputs or not all(isinstance(t, torch.Tensor) for t in example_inputs):
        raise ExportError("export: pass the example inputs as tensors: export(model, x, path=...)")
    if model.training:
        raise ExportError("export: the model is in training mode. Fix: model.eval() first")
    dest = Path(os.fspath(path)).expanduser()
    if not dest.name or str(dest).strip() == "":
        raise ExportError("export: path is empty. Fix: path='model.bundle'")
    from torch_fl.bpu.drivers import discover

    info = discover(driver=(options or {}).get("driver"))
    opts = {
        **(options or {}),
        "executor": "sim",
        "calibrate": "require" if samples is None else "auto",
        "compile_artifact": "always" if info.kind != "none" else "never",
    }
    calls, out, graphs = _trace(model, example_inputs, opts, samples)
    part, args, order, outputs = _one_partition(calls, out, graphs, example_inputs)
    host = cpu_views(args) if any(t.device.type != "cpu" for t in args) else args
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        part._prepare(host)
    built = part.last_build
    if built is None:
        raise ExportError(
            f"export: the partition could not be built ({part.entry.executor_reason})"
        )
    hbm = Path(built.hbm_path) if built.hbm_path and Path(built.hbm_path).is_file() else None
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    tmp.mkdir()
    arg_names = _argument_names(model, len(example_inputs))
    renames = {n: arg_names[order[i]] for i, n in enumerate(part.spec.input_names)}
    try:
        # as built: model.hbm was compiled from exactly these bytes (its tensor names too)
        (tmp / MODEL_ONNX).write_bytes(built.onnx_bytes)
        if hbm is not None:
            shutil.copyfile(hbm, tmp / MODEL_HBM)
        shutil.copyfile(_RUNNER_SOURCE, tmp / RUNNER)
        manifest = _manifest(
            part, host, order, outputs, renames, name or type(model).__name__,
            built.compiler_id, hbm is not None,
        )  # fmt: skip
        manifest["files"] = {f.name: sha256_file(f) for f in sorted(tmp.iterdir())}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        _place(tmp, dest, overwrite)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


class LoadedBundle:
    """A bundle as a callable on torch tensors (the board runtime or ONNX Runtime inside)."""

    def __init__(self, path: str | os.PathLike[str], runtime: str = "auto") -> None:
        try:
            self.runner = load_runner(path, runtime)
        except BundleError as exc:
            raise ExportError(str(exc)) from None
        self.manifest = self.runner.manifest
        self.runtime = self.runner.runtime

    def __call__(self, *inputs: torch.Tensor):
        order = sorted(self.manifest["inputs"], key=lambda i: i["argument"])
        if len(inputs) != len(order):
            raise ExportError(f"bundle takes {len(order)} input(s), got {len(inputs)}")
        feed = {spec["name"]: inputs[spec["argument"]].detach().cpu().numpy() for spec in order}
        try:
            result = self.runner(**feed)
        except BundleError as exc:
            raise ExportError(str(exc)) from None
        outs = [torch.from_numpy(result[o["name"]]) for o in self.manifest["outputs"]]
        return outs[0] if len(outs) == 1 else tuple(outs)


def load(path: str | os.PathLike[str], runtime: str = "auto") -> LoadedBundle:
    """The bundle at `path`, each file checked against its sha256; call it like the model."""
    return LoadedBundle(path, runtime)

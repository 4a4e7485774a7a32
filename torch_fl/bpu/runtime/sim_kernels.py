"""Which ONNX Runtime kernels the sim executor runs the int8 graph with, chosen per CPU.

ORT's fused int8 kernels are 3-5x faster than float ones, but not equally exact everywhere: on
x86 CPUs without VNNI, MLAS's u8s8 kernels multiply pairs of u8 x s8 values and add them in
saturating int16 (255 x 127 x 2 > 32767), so large activations times large weights give wrong
sums. VNNI (and AMX) accumulate straight into int32; the u8u8 kernels widen to int16 before
multiplying and never saturate. The paths, fastest first:

- `u8s8`: activations uint8 (zero point 128), weights int8 — where the CPU has VNNI;
- `mixed`: where the CPU lacks VNNI, u8s8 for the ops whose input a Relu left non-negative
  (uint8 values 0..127, zero point 0: no int16 pair sum can saturate) and u8u8 for the rest;
- `u8u8`: weights shifted to uint8 too — exact on any CPU, slower than u8s8 with VNNI;
- `float`: Q/DQ kept as float rounding steps around float kernels (the last resort).

The CPU flags say which path should be exact; a probe proves it before the path is used: a small
fused QLinearConv whose products saturate an int16 pair sum, and random values, each compared
with an int64 reference (every output within one quantization step, the requantization's
rounding). The verdict is cached per process and path.
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from torch_fl.bpu.conversion.integer_form import to_integer_form
from torch_fl.bpu.errors import ExecutorUnavailableError

VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
# aarch64: SDOT/UDOT accumulate 4 products straight into int32 (no int16 pair sums)
ARM_DOT_FLAGS = ("asimddp",)


@dataclass(frozen=True)
class KernelChoice:
    path: str
    """"u8s8", "u8u8" or "float"."""
    reason: str


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip().lower() in ("flags", "features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def has_int32_dot(flags: frozenset[str]) -> bool:
    """Whether u8 x s8 products accumulate straight into int32 (VNNI, AMX, Arm dot product)."""
    return any(f in flags for f in VNNI_FLAGS + ARM_DOT_FLAGS)


def _probe_model(
    channels: int, k: int, relu_input: bool = False
) -> tuple[onnx.ModelProto, float, float, float]:
    """A DQ -> Conv -> Q group in the reference form (int8, zero point 0); with `relu_input`
    the conv reads a Relu'd tensor (the `mixed` path's u8s8 case)."""
    x_scale, w_scale = 0.02, 0.01
    w = np.full((channels, channels, k, k), 127, np.int8)
    # as many products as the conv adds, at full scale: the output must still fit int8
    y_scale = channels * k * k * 127 * 127 * x_scale * w_scale / 120.0
    inits = [
        numpy_helper.from_array(np.array(x_scale, np.float32), "xs"),
        numpy_helper.from_array(np.array(0, np.int8), "xz"),
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(np.full(channels, w_scale, np.float32), "ws"),
        numpy_helper.from_array(np.zeros(channels, np.int8), "wz"),
        numpy_helper.from_array(np.array(y_scale, np.float32), "ys"),
        numpy_helper.from_array(np.array(0, np.int8), "yz"),
    ]
    relu = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["x0q"]),
        helper.make_node("DequantizeLinear", ["x0q", "xs", "xz"], ["x0d"]),
        helper.make_node("Relu", ["x0d"], ["xr"]),
    ]
    nodes = [
        *(relu if relu_input else []),
        helper.make_node("QuantizeLinear", ["xr" if relu_input else "x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
        helper.make_node("Conv", ["xd", "wd"], ["y"], pads=[k // 2] * 4),
        helper.make_node("QuantizeLinear", ["y", "ys", "yz"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 6, 6])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model, x_scale, w_scale, y_scale


def _reference(xq: np.ndarray, w: np.ndarray, k: int) -> np.ndarray:
    """int64 convolution (stride 1, same padding) of int8 values."""
    c, h, wd = xq.shape[1], xq.shape[2], xq.shape[3]
    pad = np.pad(xq[0].astype(np.int64), ((0, 0), (k // 2, k // 2), (k // 2, k // 2)))
    out = np.zeros((w.shape[0], h, wd), np.int64)
    for i in range(k):
        for j in range(k):
            patch = pad[:, i : i + h, j : j + wd].reshape(c, -1)
            out += (w[:, :, i, j].astype(np.int64) @ patch).reshape(-1, h, wd)
    return out


def _ort_runner(model: onnx.ModelProto):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    return lambda x: session.run(None, {"x": x})[0]


def probe(path: str, runner=_ort_runner) -> str | None:
    """None when `path`'s fused kernels match the int64 reference here, else what went wrong.

    `runner(model)` returns a function of the input array; the default is ONNX Runtime with its
    QDQ fusion on, i.e. the kernels the sim executor will run.
    """
    channels, k = 64, 3
    relu_input = path == "mixed"
    model, x_scale, w_scale, y_scale = _probe_model(channels, k, relu_input)
    run = runner(to_integer_form(model, path))
    w = next(numpy_helper.to_array(i) for i in model.graph.initializer if i.name == "w")
    rng = np.random.default_rng(0)
    shape = (1, channels, 6, 6)
    cases = {
        "saturating": np.full(shape, 127, np.int64),
        "random": rng.integers(-128, 128, shape),
        "alternating": np.where(np.arange(np.prod(shape)).reshape(shape) % 2, 127, -128),
    }
    for label, xq in cases.items():
        x = (xq * x_scale).astype(np.float32)
        got = np.rint(run(x) / y_scale).astype(np.int64)
        acc = _reference(np.maximum(xq, 0) if relu_input else xq, w, k)
        want = np.clip(np.rint(acc * (x_scale * w_scale / y_scale)), -128, 127).astype(np.int64)
        worst = int(np.abs(got[0] - want).max())
        if worst > 1:
            return (
                f"{path} kernels are not exact on this CPU: {label} inputs give outputs "
                f"{worst} quantization steps from the int64 reference (int16 saturation)"
            )
    return None


@functools.cache
def _verdict(path: str) -> str | None:
    return probe(path)


@functools.cache
def choose(setting: str) -> KernelChoice:
    """The kernel path for `sim_kernels=setting` on this CPU (probed once per process)."""
    if setting == "float":
        return KernelChoice("float", "sim_kernels='float'")
    if setting in ("u8s8", "u8u8", "mixed"):
        failure = _verdict(setting)
        if failure is not None:
            raise ExecutorUnavailableError(
                f"sim_kernels={setting!r}: {failure}. Fix: sim_kernels='auto' picks the fastest "
                "exact path for this CPU"
            )
        return KernelChoice(setting, f"sim_kernels={setting!r}, probe exact")
    flags = cpu_flags()
    machine = platform.machine()
    notes = []
    if has_int32_dot(flags):
        failure = _verdict("u8s8")
        if failure is None:
            dot = next(f for f in VNNI_FLAGS + ARM_DOT_FLAGS if f in flags)
            return KernelChoice("u8s8", f"{machine} with {dot}: u8s8 probe exact")
        notes.append(failure)
    else:
        notes.append(f"{machine} without VNNI: u8s8 would add products in saturating int16")
    # The probe decides, not the flags: where a VNNI flag's u8s8 kernels still saturate (a
    # runtime or a hypervisor that hides the instructions, or a CPU kind emulated for a
    # benchmark: scripts/cpu_kind.py), the Relu'd-input u8s8 of `mixed` may yet be exact.
    failure = _verdict("mixed")
    if failure is None:
        return KernelChoice(
            "mixed", "; ".join(notes + ["u8s8 only on Relu'd inputs (0..127), probe exact"])
        )
    notes.append(failure)
    failure = _verdict("u8u8")
    if failure is None:
        return KernelChoice("u8u8", "; ".join(notes + ["u8u8 probe exact"]))
    notes.append(failure)
    return KernelChoice("float", "; ".join(notes + ["float Q/DQ"]))

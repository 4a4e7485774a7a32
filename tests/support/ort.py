"""ONNX Runtime's static QDQ quantizer: the int8 peer this backend is measured against.

One set-up for scripts/bench_public_zoo.py, scripts/bench_sim.py and tests/support/trained.py:
export to ONNX (opset 17, TorchScript exporter, one input named "x"), then `quantize_static`
in QDQ format, calibrated with MinMax on the given inputs, int8 weights. Callers choose the
activation scheme (symmetric int8, the BPU's; or asymmetric uint8, ORT's default) and whether
weights are quantized per channel.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

INPUT = "x"


def quantize_static_qdq(
    model: torch.nn.Module,
    example: torch.Tensor,
    calib: Sequence[torch.Tensor],
    out_dir: Path,
    *,
    symmetric: bool,
    per_channel: bool = True,
) -> tuple[Path, Path]:
    """`model` as ONNX fp32 and as ORT's static QDQ int8, both written under `out_dir`.

    symmetric: int8 activations with ActivationSymmetric (zero point 0), else uint8 activations
    with an asymmetric range. Weights are int8; calibration is MinMax over `calib` (each one
    tensor fed as "x"); `example` is what the export traces with. Returns (fp32, int8) paths.
    """
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter([{INPUT: c.numpy()} for c in calib])

        def get_next(self):
            return next(self.feeds, None)

    fp32, int8 = Path(out_dir) / "fp32.onnx", Path(out_dir) / "int8.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (example,), str(fp32), dynamo=False, opset_version=17,
                          input_names=[INPUT])  # fmt: skip
        quantize_static(
            str(fp32),
            str(int8),
            Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=per_channel,
            activation_type=QuantType.QInt8 if symmetric else QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={"ActivationSymmetric": symmetric},
        )
    return fp32, int8


def cpu_session(path: Path) -> Callable[[torch.Tensor], Any]:
    """An ORT CPU session on the model at `path`: a function of "x" returning its output (a
    tuple of them where the model has several)."""
    from onnxruntime import InferenceSession

    session = InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def run(x: torch.Tensor):
        outputs = [torch.from_numpy(o) for o in session.run(None, {INPUT: x.numpy()})]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    return run

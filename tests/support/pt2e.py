"""PT2E int8 (torchao's X86InductorQuantizer) as a peer: shared by scripts/bench_sim.py (speed,
compiled with inductor) and scripts/bench_trained.py (accuracy, the converted module itself).

The quantizer's default config: per-tensor asymmetric uint8 activations and per-channel
symmetric int8 weights; the converted module holds reference quantize/dequantize ops, whose
numbers inductor's fused int8 kernels reproduce.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def quantize(
    model: torch.nn.Module, example: torch.Tensor, calib: Iterable[torch.Tensor]
) -> torch.nn.Module | None:
    """`model` exported, prepared with X86InductorQuantizer's default config, calibrated on
    `calib` and converted; None where torchao is missing (or built for another torch)."""
    try:
        import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    except Exception:  # noqa: BLE001  (not installed, or built for another torch)
        return None
    exported = torch.export.export(model, (example,)).module()
    quantizer = xiq.X86InductorQuantizer()
    quantizer.set_global(xiq.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(exported, quantizer)
    with torch.no_grad():
        for c in calib:
            prepared(c)
    return convert_pt2e(prepared)

"""What torch-fl can be built for and compile to.

Standard library only, importing nothing from torch_fl: setup.py and provisioning read this
file before torch or the extension exist (provision/floor/light.py).
"""

from __future__ import annotations

# Accelerators the C++ extension can be built for (setup.py, `invoke build --accelerator`).
ACCELERATORS: tuple[str, ...] = ("bpu",)

# BPU architectures the compile backend produces artifacts for (`BpuSettings.march`). The RDK X3
# (bernoulli2) and X5 (bayes-e) BPUs are not among them: their toolchain is not hbdk4.
MARCHES: tuple[str, ...] = ("nash-e", "nash-m", "nash-p")

# Activation precisions each march's BPU computes in (calibrate(target=...) promotes the most
# sensitive int8 tensors to the next one; "float" beyond these runs on the CPU). nash-e and
# nash-m take int16 activations, and "dual int16" (the int16 input of a Conv / Gemm / MatMul
# with int16 weights, HMCT's step after int16); nash-p also float16.
MARCH_PRECISIONS: dict[str, tuple[str, ...]] = {
    "nash-e": ("int8", "int16", "dual_int16"),
    "nash-m": ("int8", "int16", "dual_int16"),
    "nash-p": ("int8", "int16", "dual_int16", "float16"),
}

# What a tensor of a partition may be kept in (the Q/DQ pass, a saved calibration, the options):
# the BPU's integer precisions, and float (the op reading it runs on the CPU).
PRECISIONS: tuple[str, ...] = ("int8", "int16", "dual_int16", "float")

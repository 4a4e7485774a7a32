"""torch-fl for the D-Robotics RDK BPU.

`import torch_fl` (or just `import torch`, through the `torch.backends` entry point) makes the
`flagos` device available: tensors live in the board's UCP memory (host memory where no board
runtime exists) and every operator runs on the CPU over that memory without copies. The
`torch.compile(model, backend="bpu")` backend lives in `torch_fl.bpu`.
"""

from __future__ import annotations

import json
import warnings
from importlib import resources
from typing import Any

import torch

from torch_fl import _C, autograd_exit, envfile
from torch_fl import device as _device_module

__all__ = ["DEVICE_TYPE", "build_info"]

DEVICE_TYPE = _device_module.DEVICE_TYPE


def _register_device() -> None:
    # The UCP library path may come from the provisioning env file, so it is handed over before
    # the first allocation instead of being read by C++ from the process environment alone.
    _C._configure_ucp(envfile.get("FLAGOS_BPU_UCP_LIB") or "")
    if torch._C._get_privateuse1_backend_name() != DEVICE_TYPE:
        torch.utils.rename_privateuse1_backend(DEVICE_TYPE)
    if not hasattr(torch, DEVICE_TYPE):
        torch._register_device_module(DEVICE_TYPE, _device_module.as_torch_module())
    if not hasattr(torch.Tensor, "is_flagos"):
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
        )


_register_device()
autograd_exit.install()


def _warn_about_ucp_configuration() -> None:
    message = _C._ucp_warning()
    if message:
        warnings.warn(message, RuntimeWarning, stacklevel=3)


_warn_about_ucp_configuration()


def build_info() -> dict[str, Any]:
    """What was built and what the process found at run time."""
    try:
        recorded = json.loads(
            resources.files("torch_fl").joinpath("_build_config.json").read_text("utf-8")
        )
    except FileNotFoundError:
        recorded = {"accelerator": "unknown"}
    compiled = _C._compiled_with()
    return {
        "accelerator": recorded.get("accelerator", "unknown"),
        "torch_built_against": compiled["torch"],
        "torch_running": torch.__version__,
        "compiler": compiled["compiler"],
        "debug": recorded.get("debug", False),
        "memory_backend": _C._memory_backend(),
        "ucp_library": _C._ucp_library() or None,
        "fallback_mode": _C._fallback_mode(),
        "page_size": _C._page_size(),
    }


def __getattr__(name: str) -> Any:
    # The compile backend pulls in ONNX and Dynamo; load it only when asked for.
    if name == "bpu":
        import importlib

        return importlib.import_module("torch_fl.bpu")
    raise AttributeError(f"module 'torch_fl' has no attribute {name!r}")

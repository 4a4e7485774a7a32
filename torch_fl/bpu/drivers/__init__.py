"""hbdk4 compiler drivers: discovery, native (x86_64) and emulated (box64 on aarch64) runs.

Importable without hbdk4 and cheap: nothing here imports hbdk4 into this process.
"""

from torch_fl.bpu.drivers.discovery import CompilerInfo, discover
from torch_fl.bpu.drivers.driver import CompileError, compile_onnx

__all__ = ["CompileError", "CompilerInfo", "compile_onnx", "discover"]

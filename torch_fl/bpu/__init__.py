"""torch.compile backend "bpu" for RDK S-series BPUs. See docs/compile.md and README.md here."""

from torch_fl.bpu.backend import bpu_backend
from torch_fl.bpu.bundle import export, load
from torch_fl.bpu.calibrate import calibrate
from torch_fl.bpu.conversion.calibration import Calibration
from torch_fl.bpu.drivers import discover
from torch_fl.bpu.errors import BpuError, StrictModeError
from torch_fl.bpu.explainer import explain
from torch_fl.bpu.layers import LayerReport, layer_report
from torch_fl.bpu.report import Report
from torch_fl.bpu.settings import BpuSettings, SettingsError, resolve

__all__ = [
    "BpuError",
    "BpuSettings",
    "Calibration",
    "LayerReport",
    "Report",
    "SettingsError",
    "StrictModeError",
    "bpu_backend",
    "calibrate",
    "discover",
    "explain",
    "export",
    "layer_report",
    "load",
    "resolve",
]

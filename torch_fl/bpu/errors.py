"""The backend's error classes: one base, so `except BpuError` catches every refusal of ours.

Each class also derives from the builtin its callers caught before (ValueError for bad settings,
OSError for the cache, RuntimeError for compile failures), so existing handlers keep working.
Every class lives here; the modules that raise them re-export the names they always had
(`torch_fl.bpu.settings.SettingsError`, `torch_fl.bpu.cache.CacheError`, ...).
"""

from __future__ import annotations


class BpuError(Exception):
    """Base of every error the bpu backend raises on purpose (message names the problem + fix)."""


class SettingsError(BpuError, ValueError):
    """An unknown option or a value the backend cannot use."""


class StrictModeError(BpuError, RuntimeError):
    """strict=True and something was not offloaded."""


class ExecutorUnavailableError(BpuError, RuntimeError):
    """The requested executor cannot run on this machine (executor='hbm' without a board)."""


class ExportError(BpuError, RuntimeError):
    """A partition could not be expressed in ONNX."""


class QuantizationError(BpuError, RuntimeError):
    """The Q/DQ pass (or the live-weights graph built from it) could not quantize a partition."""


class CompileError(BpuError, RuntimeError):
    """hbdk4 failed or is missing; the message names the stage and the fix."""


class CacheError(BpuError, OSError):
    """The cache directory cannot be used; the message names the path and the fix."""


class ArtifactError(BpuError, RuntimeError):
    """A compiled artifact does not fit the partition it was loaded for (stale or foreign)."""


class CalibrationError(BpuError, ValueError):
    """A calibration file or calibration run is unusable; the message says how to redo it."""


class CalibrationRunError(CalibrationError, RuntimeError):
    """calibrate() ran but no BPU partition saw the samples (wrong object passed)."""


class ExplainError(BpuError, RuntimeError):
    """explain() saw no graph reach the backend."""

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


class PassRegistryError(BpuError, ValueError):
    """A lowering pass registered wrongly (the same op twice, no op at all): a bug of ours."""


_SURFACED: dict[type, type] = {}


def through_dynamo(exc: BpuError) -> BpuError:
    """`exc` as an instance Dynamo re-raises unwrapped.

    Dynamo wraps what a backend raises in BackendCompilerFailed, so `except SettingsError`
    around a compiled call would miss it. It passes its own ShortenTraceback through; a subclass
    of both the error's class and ShortenTraceback keeps every `except` clause of ours working.
    """
    try:
        from torch._dynamo.exc import ShortenTraceback
    except ImportError:  # another torch layout: the plain error is still right
        return exc
    if isinstance(exc, ShortenTraceback):
        return exc
    cls = type(exc)
    surfaced = _SURFACED.get(cls)
    if surfaced is None:
        surfaced = type(cls.__name__, (cls, ShortenTraceback), {"__module__": cls.__module__})
        surfaced.__qualname__ = cls.__qualname__
        _SURFACED[cls] = surfaced
    new = surfaced.__new__(surfaced, *exc.args)
    new.args = exc.args
    new.first_useful_frame = None
    new.__dict__.update(exc.__dict__)
    return new

"""What a provisioning step's check reports, and the typed results later steps build on.

A check returns a `CheckResult`: its status, the facts it saw (for the report) and, where later
steps depend on it, a typed result in `provides` (`Box64Found`, `X86PythonFound`,
`VendorRuntimeFound`, `TorchEnvFound`, `TorchFlFound`). Steps never reach into each other: each
names the steps it `requires` and the plan hands it their results as one `Inputs`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OK, NEEDED, FAILED = "ok", "needed", "failed"


class StepError(RuntimeError):
    """apply could not do its job; the message names the cause and the fix."""


@dataclass(frozen=True)
class Box64Found:
    """A box64 that meets the policy; `guest_libs` holds its x86_64 helper libraries, if any."""

    path: str
    version: str
    guest_libs: str = ""


@dataclass(frozen=True)
class X86PythonFound:
    """The installed x86_64 Python for hbdk4 (run under box64 on aarch64 targets)."""

    python: str
    guest_libs: str
    hbdk4: bool


@dataclass(frozen=True)
class VendorRuntimeFound:
    """The board's libhbucp, known to load."""

    ucp_lib: str


@dataclass(frozen=True)
class TorchEnvFound:
    """The board's Python environment for torch-fl: a venv whose torch imports."""

    python: str
    torch_version: str
    source: str  # wheelhouse | index | distro


@dataclass(frozen=True)
class TorchFlFound:
    """torch-fl installed into that environment, built against its torch."""

    python: str
    torch_version: str


Provided = Box64Found | X86PythonFound | VendorRuntimeFound | TorchEnvFound | TorchFlFound


@dataclass
class CheckResult:
    status: str
    facts: dict[str, Any] = field(default_factory=dict)
    detail: str = ""
    provides: Provided | None = None  # for dependent steps; not part of the report

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "detail": self.detail, "facts": self.facts}


@dataclass(frozen=True)
class Inputs:
    """The results of the steps a step `requires` (None: that step found nothing usable)."""

    box64: Box64Found | None = None
    x86_python: X86PythonFound | None = None
    vendor_runtime: VendorRuntimeFound | None = None
    torch_env: TorchEnvFound | None = None
    torch_fl: TorchFlFound | None = None


def not_applicable(why: str, **facts: Any) -> CheckResult:
    return CheckResult(OK, {"applicable": False, **facts}, f"not applicable: {why}")

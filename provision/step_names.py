"""The provisioning steps' names, in pipeline order: what `steps.skip`, --only and --skip accept.

provision/steps/__init__.py builds the pipeline in this order and refuses to import when the two
differ. The names live apart from the steps so that the configuration (provision/settings.py)
can check `steps.skip` without importing the steps, which import its types through
provision.context.
"""

from __future__ import annotations

STEP_NAMES: tuple[str, ...] = (
    "prereqs",
    "box64",
    "pagesize_probe",
    "x86_python",
    "vendor_runtime",
    "envfile",
    "torch_env",
    "torch_fl",
    "build_verify",
)

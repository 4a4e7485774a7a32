#!/usr/bin/env bash
# Fresh-machine set-up of the Python side: a virtual environment with the pinned dependencies
# (torch 2.13.0 CPU, taken from the wheel on disk, never a CUDA build) and the C++ extension built
# in place. Idempotent: a second run installs nothing new and rebuilds only what changed.
#
#   scripts/bootstrap.sh            # then: .venv/bin/invoke provision / .venv/bin/invoke test
#
# First the system packages the test lanes need (scripts/system-packages.txt), installed when
# this user can (root, or passwordless sudo); otherwise the exact apt-get command is printed and
# the lanes that need them report "not run" with it. SYSTEM=require fails instead (CI); SYSTEM=0
# skips the system packages.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${SYSTEM:-auto}" in
  0 | skip) ;;
  require) scripts/install-system-packages.sh --require ;;
  *) scripts/install-system-packages.sh ;;
esac

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}

if [ ! -x "$VENV/bin/python" ]; then
  echo "bootstrap: creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
# torch first and pinned, so nothing later can resolve an unpinned (CUDA) torch.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==2.13.0"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -r requirements.txt
# Public model definitions for the public-zoo lane; ZOO=0 skips them.
if [ "${ZOO:-1}" != 0 ]; then
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r requirements-zoo.txt
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r requirements-zoo-deps.txt
fi
# Board-farm controller tools (labgrid, docs/farm.md) in their own venv, away from pytest; FARM=0 skips.
if [ "${FARM:-1}" != 0 ]; then [ -x .venv-farm/bin/python ] || "$PYTHON" -m venv .venv-farm; .venv-farm/bin/python -m pip install -q --disable-pip-version-check -r requirements-farm.txt; fi
# No build isolation: compile against the torch installed above.
TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$VENV/bin/invoke" build --accelerator "${ACCELERATOR:-bpu}"
echo "bootstrap: done ($VENV)"

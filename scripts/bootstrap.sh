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
#
# On a provisioned board (what `invoke farm.test --setup bootstrap` does there) the environment
# `invoke provision` made is the one to test, so three knobs leave it as provisioning left it:
#   VENV=<the board's torch-env venv>   the venv to complete (default .venv, created if missing)
#   TORCH=keep                          its torch stays (the distribution's or the wheelhouse's);
#                                       default: pin torch 2.13.0
#   EXTENSION=installed                 torch-fl comes installed (built on the board by
#                                       provisioning); default: build the extension in place
#   REQUIREMENTS=requirements-board.txt what the board's lanes need instead of the whole set
set -euo pipefail
cd "$(dirname "$0")/.."

# The knobs first: a mistyped one fails before anything is installed.
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH=${TORCH:-pin}
EXTENSION=${EXTENSION:-build}
REQUIREMENTS=${REQUIREMENTS:-requirements.txt}
for knob in "TORCH=$TORCH:pin keep" "EXTENSION=$EXTENSION:build installed"; do
  value=${knob%%:*}; allowed=${knob#*:}
  case " $allowed " in *" ${value#*=} "*) ;; *)
    echo "bootstrap: $value is not one of: $allowed" >&2; exit 2 ;; esac
done
if [ ! -f "$REQUIREMENTS" ]; then
  echo "bootstrap: REQUIREMENTS=$REQUIREMENTS: no such file (requirements.txt or requirements-board.txt)" >&2
  exit 2
fi

case "${SYSTEM:-auto}" in
  0 | skip) ;;
  require) scripts/install-system-packages.sh --require ;;
  *) scripts/install-system-packages.sh ;;
esac

if [ ! -x "$VENV/bin/python" ]; then
  if [ "$TORCH" = keep ]; then
    echo "bootstrap: TORCH=keep needs an existing environment with torch; $VENV/bin/python is missing" >&2
    echo "  fix: point VENV at the board's environment (invoke provision made it), or leave TORCH out" >&2
    exit 2
  fi
  echo "bootstrap: creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
if [ "$TORCH" = keep ]; then
  if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    echo "bootstrap: TORCH=keep but $VENV/bin/python does not import torch; provision the board first" >&2
    exit 1
  fi
  echo "bootstrap: keeping torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
else
  # torch first and pinned, so nothing later can resolve an unpinned (CUDA) torch.
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==2.13.0"
fi
# The torch pin is the step above's (TORCH=keep: never replaced by the pinned set).
grep -v '^torch==' "$REQUIREMENTS" >"$VENV/.bootstrap-requirements.txt"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$VENV/.bootstrap-requirements.txt"
# Public model definitions for the public-zoo lane; ZOO=0 skips them.
if [ "${ZOO:-1}" != 0 ]; then
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r requirements-zoo.txt
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r requirements-zoo-deps.txt
fi
# Board-farm controller tools (labgrid, docs/farm.md) in their own venv, away from pytest; FARM=0 skips.
if [ "${FARM:-1}" != 0 ]; then [ -x .venv-farm/bin/python ] || "$PYTHON" -m venv .venv-farm; .venv-farm/bin/python -m pip install -q --disable-pip-version-check -r requirements-farm.txt; fi
if [ "$EXTENSION" = installed ]; then
  # The library provisioning installed is the one the lanes test: it must import from the venv,
  # not from a checkout beside it (the farm ships the checkout without torch_fl/ then).
  where=$(cd / && TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$VENV/bin/python" -c \
    "import torch_fl, torch_fl._C; print(torch_fl.__file__)" 2>&1) || {
    echo "bootstrap: EXTENSION=installed but $VENV has no working torch-fl: $where" >&2
    echo "  fix: provision the board (invoke provision --host ...: torch_fl), or EXTENSION=build" >&2
    exit 1
  }
  echo "bootstrap: torch-fl as installed: $where"
else
  # No build isolation: compile against the torch installed above.
  TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$VENV/bin/invoke" build --accelerator "${ACCELERATOR:-bpu}"
fi
echo "bootstrap: done ($VENV)"

#!/usr/bin/env bash
# Install the system packages the test lanes need, from the one list scripts/system-packages.txt.
#
#   scripts/install-system-packages.sh            # install what is missing when this user can
#   scripts/install-system-packages.sh --require  # ... and fail when it cannot (CI)
#   scripts/install-system-packages.sh --print    # only print the packages still missing
#
# "Can" means root, or sudo without a password; nothing ever prompts. Otherwise the exact
# command to run is printed, and (without --require) the script succeeds: lanes that need the
# packages then report "not run" with the same command.
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=${1:-auto}
LIST=scripts/system-packages.txt

packages=$(sed -e 's/#.*//' "$LIST" | awk -F: 'NF > 1 { print $2 }' | xargs -n1 | awk '!seen[$0]++' | xargs)
missing=""
for pkg in $packages; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $pkg"
  fi
done
missing=${missing# }

if [ "$MODE" = "--print" ]; then
  echo "$missing"
  exit 0
fi
if [ -z "$missing" ]; then
  echo "system packages: all present ($LIST)"
  exit 0
fi

fail() {
  echo "system packages: $1" >&2
  echo "system packages: run: sudo apt-get install -y --no-install-recommends $missing" >&2
  if [ "$MODE" = "--require" ]; then exit 1; fi
  exit 0
}

command -v apt-get >/dev/null 2>&1 || fail "no apt-get on this machine; install the equivalents of: $missing"
if [ "$(id -u)" -eq 0 ]; then
  SUDO=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  SUDO="sudo -n"
else
  fail "cannot install $missing (not root, and sudo needs a password)"
fi
echo "system packages: installing $missing"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || fail "apt-get update failed"
# shellcheck disable=SC2086 # one word per package
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null || fail "apt-get install failed"

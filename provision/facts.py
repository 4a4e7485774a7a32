"""Facts about a target, gathered with one POSIX shell script (no Python needed on the target)."""

from __future__ import annotations

from typing import Any

from provision.target import Target

_SCRIPT = r"""
kv() { printf '%s=%s\n' "$1" "$2"; }
kv arch "$(uname -m)"
kv kernel "$(uname -r)"
if [ -r /etc/os-release ]; then . /etc/os-release; kv distro "${ID:-unknown}"; kv distro_version "${VERSION_ID:-unknown}"; kv distro_codename "${VERSION_CODENAME:-}"; fi
kv glibc "$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')"
kv pagesize "$(getconf PAGESIZE 2>/dev/null)"
kv cpu "$(awk -F: '/^model name|^Model|^CPU part/{gsub(/^ +/,"",$2); print $2; exit}' /proc/cpuinfo 2>/dev/null)"
kv cpus "$(nproc 2>/dev/null || echo 1)"
kv mem_mb "$(awk '/^MemTotal/{print int($2/1024)}' /proc/meminfo 2>/dev/null)"
kv home "$HOME"
kv data_home "${XDG_DATA_HOME:-$HOME/.local/share}"
kv config_home "${XDG_CONFIG_HOME:-$HOME/.config}"
kv cache_home "${XDG_CACHE_HOME:-$HOME/.cache}"
kv env_file "${FLAGOS_BPU_ENV_FILE:-${XDG_CONFIG_HOME:-$HOME/.config}/torch-fl/env}"
mkdir -p "$HOME" 2>/dev/null
kv disk_free_mb "$(df -Pm "$HOME" 2>/dev/null | awk 'NR==2{print $4}')"
kv uid "$(id -u)"
kv sudo "$(command -v sudo || true)"
kv apt "$(command -v apt-get || true)"
kv python "$(command -v python3 || true)"
kv python_version "$(python3 -c 'import platform; print(platform.python_version())' 2>/dev/null)"
kv board_model "$(tr -d '\000' < /proc/device-tree/model 2>/dev/null)"
if [ -e /usr/hobot/lib/libhbucp.so ]; then kv ucp_lib /usr/hobot/lib/libhbucp.so; else kv ucp_lib ""; fi
if [ -d /usr/hobot ] && command -v python3 >/dev/null; then
  if python3 -c 'import hbm_runtime' >/dev/null 2>&1; then kv hbm_runtime yes; else kv hbm_runtime no; fi
else kv hbm_runtime no; fi
"""

INT_KEYS = ("pagesize", "cpus", "mem_mb", "disk_free_mb", "uid")

# Board model strings -> BPU march; the march is part of an artifact's identity.
_MARCH_BY_MODEL = (
    ("S100P", "nash-m"),
    ("S100", "nash-e"),
    ("S600", "nash-p"),
    ("X5", "bayes-e"),
    ("X3", "bernoulli2"),
)


def parse(text: str) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            facts[key.strip()] = value.strip()
    for key in INT_KEYS:
        try:
            facts[key] = int(facts.get(key) or 0)
        except ValueError:
            facts[key] = 0
    facts["arch"] = {"arm64": "aarch64"}.get(facts.get("arch", ""), facts.get("arch", ""))
    facts["is_board"] = bool(facts.get("ucp_lib")) or "RDK" in facts.get("board_model", "")
    return facts


def gather(target: Target) -> dict[str, Any]:
    rc, out, err = target.run(_SCRIPT, timeout=60)
    if rc != 0 and "arch=" not in out:
        raise RuntimeError(f"gathering facts on {target.name} failed (rc {rc}): {err.strip()}")
    return parse(out)


def march_for(facts: dict[str, Any]) -> str | None:
    model = facts.get("board_model", "").upper()
    for needle, march in _MARCH_BY_MODEL:
        if needle in model:
            return march
    return None

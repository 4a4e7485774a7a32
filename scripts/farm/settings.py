"""Where the coordinator is and how to reach each place's board over SSH.

Settings come from, highest first: command-line options, the environment (`LG_COORDINATOR`), a
farm YAML file (`--farm-config`), then the `farm:` section of invoke.yaml:

    farm:
      coordinator: 10.0.0.5:20408
      ssh: {identity: ~/.ssh/farm_ed25519, known_hosts: ~/.ssh/farm_known_hosts}
      places:
        rdk-s600-01: {ssh: {identity: ~/.ssh/s600_ed25519}}
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provision.config import ConfigError, read_yaml_mapping

_ADDRESS = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})$")
SSH_KEYS = ("identity", "known_hosts")


@dataclass
class FarmSettings:
    coordinator: str
    ssh: dict[str, str] = field(default_factory=dict)
    places: dict[str, dict[str, Any]] = field(default_factory=dict)

    def ssh_for(self, place: str) -> dict[str, str]:
        """identity/known_hosts for a place: its own entry over the farm-wide one."""
        merged = {k: v for k, v in self.ssh.items() if v}
        merged.update({k: v for k, v in self.places.get(place, {}).get("ssh", {}).items() if v})
        return {k: os.path.expanduser(str(v)) for k, v in merged.items()}


def _check_ssh(section: Any, where: str) -> dict[str, str]:
    if section is None:
        return {}
    if not isinstance(section, dict) or set(section) - set(SSH_KEYS):
        raise ValueError(f"{where}: ssh must be a mapping with keys {', '.join(SSH_KEYS)}")
    for key, value in section.items():
        if value is not None and not isinstance(value, str):  # str([1]) is no path
            raise ValueError(f"{where}: ssh.{key} = {value!r}: use a file path (a string)")
    return {k: str(v) for k, v in section.items() if v}


def load(
    coordinator: str | None,
    farm_config: str | None,
    invoke_section: dict[str, Any] | None,
) -> FarmSettings:
    """Merge the sources; ValueError names the missing or malformed setting and the fix."""
    section: dict[str, Any] = dict(invoke_section or {})
    # An empty value ("$UNSET") is a mistake, never "fall back to the next source".
    for flag, value in (("--coordinator", coordinator), ("--farm-config", farm_config)):
        if value is not None and not value.strip():
            raise ValueError(f"{flag} {value!r} is empty; give a value or leave the flag out")
    if farm_config:
        path = Path(farm_config).expanduser()
        try:
            loaded = read_yaml_mapping(path, "--farm-config")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        section.update(loaded)
    unknown = set(section) - {"coordinator", "ssh", "places"}
    if unknown:
        raise ValueError(f"farm settings: unknown key(s) {sorted(unknown)}")
    address = coordinator or os.environ.get("LG_COORDINATOR") or section.get("coordinator")
    if not address:
        raise ValueError(
            "no coordinator: pass --coordinator HOST:PORT, set LG_COORDINATOR, or put "
            "`farm: {coordinator: HOST:PORT}` in invoke.yaml"
        )
    match = _ADDRESS.match(str(address))
    if not match:
        raise ValueError(f"coordinator {address!r} is not HOST:PORT (e.g. 10.0.0.5:20408)")
    if not 0 < int(match[2]) < 65536:
        raise ValueError(f"coordinator {address!r}: port {int(match[2])} is outside 1..65535")
    places = section.get("places") or {}
    if not isinstance(places, dict):
        raise ValueError("farm settings: places must map place names to settings")
    checked = {}
    for name, entry in places.items():
        entry = entry or {}
        if not isinstance(entry, dict) or set(entry) - {"ssh"}:
            raise ValueError(f"farm settings: places.{name} may only hold ssh")
        checked[str(name)] = {"ssh": _check_ssh(entry.get("ssh"), f"places.{name}")}
    return FarmSettings(str(address), _check_ssh(section.get("ssh"), "farm"), checked)

"""`python -m scripts.farm.resolve PLACE`: print one JSON line with the place's resources.

Runs labgrid's `RemotePlace` (which talks to `LG_COORDINATOR`) in its own process, so its event
loop never shares a process with the threads that hold other places. Output:
`{"place", "tags", "network": {address, port, username, avail} | null, "power": bool,
"serial": bool, "resources": [class names]}`.
"""

from __future__ import annotations

import json
import sys


def resolve(place: str) -> dict:
    from labgrid import Target
    from labgrid.resource.remote import RemotePlace

    target = Target(place)
    remote = RemotePlace(target, name=place)
    network = None
    classes = []
    for resource in target.resources:
        if resource is remote:
            continue
        cls = type(resource).__name__
        classes.append(cls)
        if cls == "NetworkService" and network is None:
            network = {
                "address": resource.address,
                "port": int(resource.port),
                "username": resource.username,
                "avail": bool(resource.avail),
            }
    return {
        "place": place,
        "tags": dict(remote.tags),
        "network": network,
        "power": any("Power" in c for c in classes),
        "serial": any("Serial" in c for c in classes),
        "resources": sorted(classes),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m scripts.farm.resolve PLACE", file=sys.stderr)
        return 2
    print(json.dumps(resolve(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

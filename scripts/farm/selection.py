"""Which places to hold: `--place NAME` (repeatable) or tag filters with `--count N`."""

from __future__ import annotations

from dataclasses import dataclass

from scripts.farm.labgrid_client import TAG

MAX_COUNT = 64


@dataclass(frozen=True)
class Request:
    """One reservation to make: its filters, and how reports name it until a place is known."""

    label: str
    filters: dict[str, str]


def parse_tags(items: list[str]) -> dict[str, str]:
    """`board=rdk-s600 pagesize=65536` (or comma lists) -> dict; ValueError names the bad one."""
    tags: dict[str, str] = {}
    for text in (t.strip() for item in items for t in item.replace(",", " ").split()):
        if not TAG.match(text):
            raise ValueError(
                f"tag filter {text!r} is not key=value (lower-case key, value of letters, digits, "
                "'_', '.', ':' or '-'); example: board=rdk-s600"
            )
        key, _, value = text.partition("=")
        if key in tags and tags[key] != value:
            raise ValueError(f"tag {key} is given twice ({tags[key]} and {value})")
        tags[key] = value
    return tags


def requests(places: list[str], tags: list[str], count: int | None) -> list[Request]:
    """Reservations for the selection; ValueError for an empty or contradictory one."""
    names = [n.strip() for item in places for n in item.split(",") if n.strip()]
    filters = parse_tags(tags)
    if "name" in filters:
        raise ValueError("use --place NAME rather than a name= tag filter")
    if len(set(names)) != len(names):
        raise ValueError(f"--place lists a place twice: {names}")
    if names:
        if count not in (None, len(names)):
            raise ValueError(f"--count {count} contradicts the {len(names)} --place names given")
        return [Request(name, {**filters, "name": name}) for name in names]
    if not filters:
        raise ValueError(
            "no places selected: give --place NAME or tag filters such as "
            "--tag board=rdk-s600 --tag pagesize=65536 (with --count N)"
        )
    count = 1 if count is None else count
    if not 1 <= count <= MAX_COUNT:
        raise ValueError(f"--count must be 1..{MAX_COUNT}, got {count}")
    label = " ".join(f"{k}={v}" for k, v in filters.items())
    return [Request(f"{label} #{i + 1}" if count > 1 else label, filters) for i in range(count)]

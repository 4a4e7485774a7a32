"""The provisioning report: a table for people, JSON (written atomically) for machines."""

from __future__ import annotations

import json
import shutil
import textwrap
import time
from pathlib import Path
from typing import Any

from provision.floor import exitcodes, light
from provision.plan import Outcome
from provision.settings import Settings

SCHEMA = "torch-fl/provision-report/1"
STATUSES = {"ok", "needed", "failed"}


def build(
    *,
    target: str,
    local: bool,
    dry: bool,
    started: float,
    facts: dict[str, Any],
    outcomes: list[Outcome],
    artifacts: list[dict[str, str]],
    exit_code: int,
    config: Settings,
) -> dict[str, Any]:
    unique = {a["name"]: a for a in artifacts}
    return {
        "schema": SCHEMA,
        "target": target,
        "local": local,
        "dry": dry,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": round(time.time() - started, 3),
        "exit_code": exit_code,
        "actions": sum(1 for o in outcomes if o.action == "apply"),
        "interrupted": any(o.action == "interrupted" for o in outcomes),
        "facts": facts,
        "steps": [
            {
                "name": o.name,
                "title": o.title,
                "before": o.before.to_json() if o.before else None,
                "action": o.action,
                "after": o.after.to_json() if o.after else None,
                "duration_s": round(o.duration_s, 3),
                "error": o.error,
            }
            for o in outcomes
        ],
        "artifacts": sorted(unique.values(), key=lambda a: a["name"]),
        "config": {"min_box64": config.policy.min_box64, "prefix": config.prefix},
    }


def validate(report: dict[str, Any]) -> None:
    """Raise ValueError naming the first schema violation."""
    if report.get("schema") != SCHEMA:
        raise ValueError(f"schema is {report.get('schema')!r}, expected {SCHEMA}")
    for key, kind in (
        ("target", str),
        ("dry", bool),
        ("exit_code", int),
        ("actions", int),
        ("facts", dict),
        ("steps", list),
        ("artifacts", list),
    ):
        if not isinstance(report.get(key), kind):
            raise ValueError(f"{key} must be {kind.__name__}")
    codes = (exitcodes.OK, exitcodes.FAILED, exitcodes.USAGE, exitcodes.INTERRUPTED)
    if report["exit_code"] not in codes:
        raise ValueError("exit_code must be {}, {}, {} or {} (interrupted)".format(*codes))
    applied = 0
    for step in report["steps"]:
        for side in ("before", "after"):
            res = step.get(side)
            if res is not None and res.get("status") not in STATUSES:
                raise ValueError(f"step {step.get('name')}: {side}.status {res.get('status')!r}")
        if step["action"] == "apply":
            applied += 1
            if step.get("after") is None and not report.get("interrupted"):
                raise ValueError(f"step {step['name']} applied without a re-check")
        if not isinstance(step.get("duration_s"), (int, float)) or step["duration_s"] < 0:
            raise ValueError(f"step {step.get('name')}: bad duration")
    if applied != report["actions"]:
        raise ValueError("actions does not match the applied steps")
    for art in report["artifacts"]:
        if len(art.get("sha256", "")) != 64:
            raise ValueError(f"artifact {art.get('name')} lacks a sha256")


def write_atomic(path: Path, report: dict[str, Any]) -> None:
    text = json.dumps(report, indent=2, sort_keys=True, default=str) + "\n"
    light.load("atomic").write_text(path, text)


def _cell(res: Any) -> str:
    return res.status if res is not None else "-"


def table(outcomes: list[Outcome], width: int | None = None) -> str:
    """Aligned columns; a long detail wraps at word boundaries under its column, never cut.

    `width` is the line width to wrap to (default: the terminal's, at least 100).
    """
    rows = [("step", "before", "action", "after", "duration", "detail")]
    for o in outcomes:
        detail = o.error or (o.final.detail if o.final else "")
        rows.append(
            (
                o.name,
                _cell(o.before),
                o.action,
                _cell(o.after),
                f"{o.duration_s:.1f}s",
                "\n".join(line.rstrip() for line in detail.strip("\n").splitlines()),
            )
        )
    return wrapped_table(rows, width)


def wrapped_table(rows: list[tuple[str, ...]], width: int | None = None) -> str:
    """`rows[0]` is the header; every column but the last is padded, and the last (a free-text
    detail) wraps at word boundaries under its own column instead of being cut.

    `width` is the line width to wrap to (default: the terminal's, at least 100). A detail of
    several lines (build_verify's coverage table) keeps its lines, each under the column, and
    only a line longer than the column wraps.
    """
    fixed = len(rows[0]) - 1
    widths = [max(len(r[i]) for r in rows) for i in range(fixed)]
    indent = sum(widths) + 2 * fixed
    if width is None:
        width = max(100, shutil.get_terminal_size((120, 24)).columns)
    detail_width = max(40, width - indent)
    lines = []
    for i, row in enumerate(rows):
        head = "  ".join(c.ljust(widths[j]) for j, c in enumerate(row[:fixed])) + "  "
        parts = [
            part
            for line in (row[fixed].splitlines() or [""])
            for part in (
                [line]
                if len(line) <= detail_width
                else textwrap.wrap(line, detail_width, break_long_words=False)
            )
        ] or [""]
        lines.append((head + parts[0]).rstrip())
        lines += [" " * indent + part for part in parts[1:]]
        if i == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 6)
    return "\n".join(lines)

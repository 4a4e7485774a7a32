"""One report for many boards: a place x lane table, one junit file, one JSON summary.

Per place the verdict is `ok`, `failed` (a lane had failed/unexpected-pass tests) or
`infra-error` (the place was never held, never answered, never produced a summary, its exporter
vanished, its detected facts contradict its tags, or a lane passed nothing). Only a run where
every requested place and lane is `ok` exits 0.
"""

from __future__ import annotations

import json
import os
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts.testmatrix.junit import make_xml_safe

SCHEMA = "torch-fl/farm-report/1"
BAD_BUCKETS = ("failed", "unexpected-pass", "infra-error")
# facts worth carrying into junit properties and the table
FACT_KEYS = ("arch", "pagesize", "distro", "distro_version", "kernel", "glibc", "board_model")


@dataclass
class PlaceOutcome:
    label: str  # the request (place name or tag filter) until a place is held
    place: str | None = None
    token: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    network: dict[str, Any] | None = None
    power: bool = False
    serial: bool = False
    facts: dict[str, Any] = field(default_factory=dict)
    provision: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None
    junit: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    results: list[str] = field(default_factory=list)  # the lanes' per-test records (jsonl)
    errors: list[str] = field(default_factory=list)
    started: float = 0.0
    finished: float = 0.0
    released: bool = False
    power_cycled: bool = False

    @property
    def name(self) -> str:
        return self.place or self.label

    def infra(self, message: str) -> None:
        self.errors.append(message)


def tag_contradictions(tags: dict[str, str], facts: dict[str, Any]) -> list[str]:
    """Tags that say something the board's own detection denies (arch, page size)."""
    checks = {
        "arch": str(facts.get("arch") or ""),
        "pagesize": str(facts.get("pagesize") or facts.get("page_size") or ""),
    }
    return [
        f"tag {key}={tags[key]} but the board reports {key}={seen or 'nothing'}"
        for key, seen in checks.items()
        if key in tags and tags[key] != seen
    ]


def lane_rows(outcome: PlaceOutcome, lanes: list[str]) -> list[dict[str, Any]]:
    """One row per requested lane: its buckets and verdict on this place."""
    by_name = {ln["name"]: ln for ln in (outcome.summary or {}).get("lanes", [])}
    rows = []
    for lane in lanes:
        data = by_name.get(lane)
        row: dict[str, Any] = {"place": outcome.name, "lane": lane, "buckets": {}, "time_s": 0.0}
        if outcome.errors and data is None:
            row["verdict"], row["why"] = "infra-error", outcome.errors[0]
        elif data is None:
            row["verdict"] = "infra-error"
            row["why"] = "no summary for this lane" if outcome.summary else "no summary"
        else:
            buckets = data.get("buckets", {})
            row["buckets"], row["time_s"] = buckets, float(data.get("duration_s") or 0.0)
            if data.get("status") != "ran":
                row["verdict"] = "infra-error"
                row["why"] = f"not run on the board (missing: {', '.join(data.get('missing', []))})"
            elif any(buckets.get(b) for b in BAD_BUCKETS):
                row["verdict"] = "infra-error" if buckets.get("infra-error") else "failed"
                probs = data.get("problems") or [{}]
                row["why"] = f"{probs[0].get('nodeid', '')}: {probs[0].get('message', '')}"[:200]
            elif not buckets.get("passed") and not buckets.get("expected-fail"):
                row["verdict"], row["why"] = "infra-error", "nothing passed (all skipped?)"
            else:
                row["verdict"], row["why"] = "ok", ""
            if outcome.errors:  # a lane ran, but the place itself went wrong (exporter gone)
                row["verdict"], row["why"] = "infra-error", outcome.errors[0]
        rows.append(row)
    return rows


def provision_rows(outcome: PlaceOutcome) -> list[dict[str, Any]]:
    prov = outcome.provision or {}
    verdict = (
        "infra-error" if outcome.errors else ("ok" if prov.get("status") == "ok" else "failed")
    )
    why = outcome.errors[0] if outcome.errors else (prov.get("error") or "")
    return [{"place": outcome.name, "lane": "provision", "buckets": {}, "verdict": verdict,
             "why": why, "time_s": float(prov.get("duration_s") or 0.0)}]  # fmt: skip


def format_table(rows: list[dict[str, Any]]) -> str:
    heads = ["place", "lane", "pass", "fail", "xfail", "xpass", "skip", "infra", "time", "result"]
    keys = ["passed", "failed", "expected-fail", "unexpected-pass", "skipped", "infra-error"]
    table = [heads]
    for r in rows:
        counts = [str(r["buckets"].get(k, "-")) if r["buckets"] else "-" for k in keys]
        verdict = r["verdict"] + (f": {r['why']}" if r.get("why") else "")
        table.append([r["place"], r["lane"], *counts, f"{r['time_s']:.1f}s", verdict[:150]])
    widths = [max(len(row[i]) for row in table) for i in range(len(heads) - 1)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        for row in table
    )


def _atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def merged_junit(outcomes: list[PlaceOutcome], rows: list[dict[str, Any]]) -> ET.Element:
    """Every board's lane suites renamed `<place>:<lane>`, facts as suite properties; a place
    or lane with no junit of its own gets a suite with one erroring case, so it is never absent."""
    root = ET.Element("testsuites")
    for outcome in outcomes:
        have: set[str] = set()
        for path in sorted(outcome.junit):
            try:
                tree = ET.parse(path)
            except (ET.ParseError, OSError) as exc:
                outcome.infra(f"unreadable junit {path}: {exc}")
                continue
            lane = Path(path).stem
            suites = [tree.getroot()] if tree.getroot().tag == "testsuite" else list(tree.getroot())
            for suite in suites:
                suite.set("name", f"{outcome.name}:{lane}")
                _add_properties(suite, outcome)
                root.append(suite)
            have.add(lane)
        for row in rows:
            if row["place"] == outcome.name and row["lane"] not in have and row["verdict"] != "ok":
                suite = ET.SubElement(root, "testsuite", name=f"{outcome.name}:{row['lane']}",
                                      tests="1", failures="0", errors="1")  # fmt: skip
                _add_properties(suite, outcome)
                case = ET.SubElement(suite, "testcase", classname=suite.get("name"), name="place")
                ET.SubElement(case, "error", message=row["why"][:200]).text = row["why"]
    return root


def _add_properties(suite: ET.Element, outcome: PlaceOutcome) -> None:
    props = suite.find("properties")
    if props is None:
        props = ET.Element("properties")
        suite.insert(0, props)
    values = {f"fact.{k}": outcome.facts.get(k) for k in FACT_KEYS}
    values.update({f"tag.{k}": v for k, v in outcome.tags.items()})
    values.update(place=outcome.place, power=outcome.power, serial=outcome.serial)
    values["power_cycled"] = outcome.power_cycled
    for key, value in values.items():
        if value not in (None, ""):
            ET.SubElement(props, "property", name=key, value=str(value))


def write(
    outcomes: list[PlaceOutcome],
    rows: list[dict[str, Any]],
    out_dir: Path,
    meta: dict[str, Any],
) -> tuple[int, Path, Path]:
    """Write farm.json and junit.xml under out_dir; return (exit code, json path, junit path)."""
    code = 0 if rows and all(r["verdict"] == "ok" for r in rows) else 1
    junit_root = merged_junit(outcomes, rows)
    make_xml_safe(junit_root)  # a board's messages may hold colour codes or NUL
    junit_path = out_dir / "junit.xml"
    _atomic(junit_path, ET.tostring(junit_root, encoding="unicode"))
    doc = {
        "schema": SCHEMA,
        **meta,
        "finished": round(time.time(), 3),
        "exit_code": code,
        "rows": rows,
        "places": [
            {
                "label": o.label,
                "place": o.place,
                "token": o.token,
                "tags": o.tags,
                "network": o.network,
                "power": o.power,
                "serial": o.serial,
                "facts": {k: o.facts.get(k) for k in FACT_KEYS},
                "capabilities": (o.summary or {}).get("capabilities"),
                "provision": o.provision,
                "errors": o.errors,
                "started": round(o.started, 3),
                "finished": round(o.finished, 3),
                "released": o.released,
                "power_cycled": o.power_cycled,
                "junit": o.junit,
                "logs": o.logs,
            }
            for o in outcomes
        ],
    }
    json_path = out_dir / "farm.json"
    _atomic(json_path, json.dumps(doc, indent=2, sort_keys=True, default=str))
    return code, json_path, junit_path

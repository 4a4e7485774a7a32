"""Make a lane's junit XML tell the whole story of its run, and keep it valid XML.

pytest writes its junit only when it finishes; a lane killed by its timeout or a Ctrl-C leaves
none, and pytest never knows about stale expectations or the lane's own timeout. Missing files
are rebuilt from the per-test results, and every infra-error that is not already a testcase
becomes an `<error>` testcase, so dashboards cannot show green.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from provision.floor import light
from scripts.testmatrix.results import LaneResult

_atomic_write = light.load("atomic").write_text

# Characters XML 1.0 cannot hold (colour codes, NUL): written as \xNN so the file stays junit.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_safe(text: str) -> str:
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def make_xml_safe(tree: ET.Element) -> None:
    """Rewrite every text and attribute of `tree` in place so it serializes as valid XML."""
    for element in tree.iter():
        element.text = _xml_safe(element.text) if element.text else element.text
        for key, value in element.attrib.items():
            element.set(key, _xml_safe(value))


def _case_ids(case: ET.Element) -> set[str]:
    ids = {p.get("value", "") for p in case.iter("property") if p.get("name") == "nodeid"}
    ids.add(f"{case.get('classname', '')}::{case.get('name', '')}")
    return ids


def _read(junit: Path) -> ET.Element | None:
    """pytest's junit for this run, or None when there is none to trust."""
    if not junit.is_file():
        return None
    try:
        return ET.parse(junit).getroot()
    except ET.ParseError:
        return None  # cut short by a kill: rebuilt from the records


def _rebuilt(name: str, records: list[dict[str, Any]]) -> ET.Element:
    """A junit tree with one testcase per finished test in the plugin's records."""
    tree = ET.Element("testsuites")
    suite = ET.SubElement(tree, "testsuite", name=name)
    for rec in records:
        if rec.get("event") is not None or "bucket" not in rec:
            continue
        case = ET.SubElement(suite, "testcase", classname=name, name=rec["nodeid"], time="0")
        props = ET.SubElement(case, "properties")
        ET.SubElement(props, "property", name="nodeid", value=rec["nodeid"])
        if rec.get("expectation"):
            ET.SubElement(props, "property", name="matrix_expectation", value=rec["expectation"])
        bucket = rec["bucket"]
        message = rec.get("message", "")
        if bucket in ("failed", "unexpected-pass"):
            ET.SubElement(case, "failure", message=message[:200]).text = message
        elif bucket == "infra-error":
            ET.SubElement(case, "error", message=message[:200]).text = message
        elif bucket in ("skipped", "expected-fail"):
            kind = "pytest.xfail" if bucket == "expected-fail" else "pytest.skip"
            ET.SubElement(case, "skipped", type=kind, message=message[:200])
    return tree


def _add_infra_errors(suite: ET.Element, result: LaneResult) -> None:
    """One `<error>` testcase for each infra-error of `result` that no testcase shows yet."""
    known: set[str] = set()
    for case in suite.iter("testcase"):
        known |= _case_ids(case)
    for problem in result.problems:
        nodeid = problem["nodeid"]
        # pytest names a collection error's testcase after the module (tests.a.test_b).
        dotted = nodeid[:-3].replace("/", ".") if nodeid.endswith(".py") else nodeid
        if problem["bucket"] != "infra-error" or {nodeid, f"::{dotted}"} & known:
            continue
        case = ET.SubElement(
            suite, "testcase", classname=f"{result.name}.matrix", name=problem["nodeid"], time="0"
        )
        props = ET.SubElement(case, "properties")
        ET.SubElement(props, "property", name="nodeid", value=problem["nodeid"])
        ET.SubElement(case, "error", message=problem["message"][:200]).text = problem["message"]
        known.add(problem["nodeid"])


def finish_junit(
    result: LaneResult, junit: Path, records: list[dict[str, Any]] | None = None
) -> None:
    """Make `junit` tell the whole story of this run of the lane (see the module docstring)."""
    tree = _read(junit)
    if tree is None:
        tree = _rebuilt(result.name, records or [])
    suite = tree.find("testsuite") if tree.tag == "testsuites" else tree
    if suite is None:
        suite = ET.SubElement(tree, "testsuite", name=result.name)
    _add_infra_errors(suite, result)
    make_xml_safe(tree)
    cases = list(suite.iter("testcase"))
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(1 for c in cases if c.find("failure") is not None)))
    suite.set("errors", str(sum(1 for c in cases if c.find("error") is not None)))
    suite.set("skipped", str(sum(1 for c in cases if c.find("skipped") is not None)))
    _atomic_write(junit, ET.tostring(tree, encoding="unicode"))
    result.junit = str(junit)

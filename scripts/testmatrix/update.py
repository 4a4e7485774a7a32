"""Propose matrix.yaml changes from a matrix run's junit XML, as a diff for review.

Two kinds of proposal:
- a test that failed and no expectation covers it -> a new entry whose `reason` and `link` are
  FIXME placeholders (the schema rejects those, so nobody can merge it without saying why);
- an entry all of whose tests now pass ([XPASS(strict)]) -> remove it.

The file is edited as text (not re-dumped YAML) so comments and layout survive.
"""

from __future__ import annotations

import difflib
import json
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import yaml

from provision.floor import light
from scripts.testmatrix.capabilities import is_present
from scripts.testmatrix.plugin import CRASH_TEXT
from scripts.testmatrix.schema import Matrix, MatrixError, parse


@dataclass
class Case:
    lane: str
    nodeid: str
    outcome: str  # passed | failed | error | crash | expected-fail | unexpected-pass | skipped
    expectation: str | None  # "matrix.yaml:LINE" when an entry matched


def _nodeid(case: ET.Element) -> str:
    for prop in case.iter("property"):
        if prop.get("name") == "nodeid":
            return prop.get("value", "")
    # Reports without properties (xdist worker crashes): rebuild from file + name.
    return f"{case.get('file') or case.get('classname', '')}::{case.get('name', '')}"


def read_junit(junit_dir: Path) -> list[Case]:
    """Every testcase of every `<lane>.xml` in `junit_dir`."""
    cases: list[Case] = []
    for xml_file in sorted(junit_dir.glob("*.xml")):
        lane = xml_file.stem
        try:
            root = ET.parse(xml_file).getroot()
        except ET.ParseError as err:  # cut short or not junit at all: say which file
            raise MatrixError(
                str(xml_file), err.position[0], f"not junit XML ({err}); re-run the matrix"
            ) from None
        for case in root.iter("testcase"):
            if case.get("classname", "").endswith(".matrix"):
                # The runner's own records (lane timeout, stale entry, interrupt): infra
                # problems to fix, never a test failure to declare as expected.
                continue
            expectation = next(
                (
                    p.get("value")
                    for p in case.iter("property")
                    if p.get("name") == "matrix_expectation"
                ),
                None,
            )
            bad = case.find("failure")
            if bad is None:
                bad = case.find("error")
            skipped = case.find("skipped")
            if bad is not None:
                text = f"{bad.get('message', '')}\n{bad.text or ''}"
                if "[XPASS(strict)]" in text:
                    outcome = "unexpected-pass"
                elif CRASH_TEXT.search(text):
                    outcome = "crash"
                else:
                    outcome = "error" if bad.tag == "error" else "failed"
            elif skipped is not None:
                outcome = "expected-fail" if skipped.get("type") == "pytest.xfail" else "skipped"
            else:
                outcome = "passed"
            cases.append(Case(lane, _nodeid(case), outcome, expectation))
    return cases


def _entry_spans(text: str) -> tuple[dict[int, tuple[int, int]], int | None, str]:
    """Map entry start line (1-based) -> [first, end) 0-based line span; insertion point; indent."""
    lines = text.splitlines()
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    seq = None
    for key, value in root.value:
        if key.value == "expectations":
            seq = value
    if seq is None or not isinstance(seq, yaml.SequenceNode) or not seq.value:
        return {}, None, "  "
    starts = [item.start_mark.line for item in seq.value]
    spans: dict[int, tuple[int, int]] = {}
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else seq.end_mark.line + 1
        end = min(end, len(lines))
        while end > start + 1 and (not lines[end - 1].strip() or lines[end - 1].startswith("#")):
            end -= 1  # trailing blanks/comments belong to whatever follows
        first = start
        while first > 0 and lines[first - 1].strip().startswith("#"):
            first -= 1  # a comment right above an entry describes it
        spans[start + 1] = (first, end)
    dash_line = lines[starts[0]]
    indent = dash_line[: len(dash_line) - len(dash_line.lstrip())]
    return spans, max(end for _, end in spans.values()), indent


def _new_entry(indent: str, nodeid: str, lanes: list[str], status: str, lacked: list[str]) -> str:
    lines = [
        f"{indent}- test: {json.dumps(nodeid)}",
        f"{indent}  lanes: [{', '.join(lanes)}]",
    ]
    if lacked:
        lines.append(f"{indent}  # this run lacked: {', '.join(lacked)} (add a `when:` if related)")
    lines += [
        f"{indent}  status: {status}",
        f'{indent}  reason: "FIXME: why does this fail here, and what would fix it?"',
        f'{indent}  link: "FIXME: issue or docs link"',
    ]
    return "\n".join(lines)


def propose(
    matrix: Matrix, text: str, cases: list[Case], caps: dict[str, object] | None = None
) -> tuple[str, list[str]]:
    """New matrix text and human notes (entries that could not be changed automatically)."""
    notes: list[str] = []
    lines = text.splitlines()
    spans, insert_at, indent = _entry_spans(text)
    by_entry: dict[str, list[Case]] = {}
    for case in cases:
        if case.expectation:
            by_entry.setdefault(case.expectation, []).append(case)
    remove: list[tuple[int, int]] = []
    for exp in matrix.expectations:
        matched = by_entry.get(exp.location) or by_entry.get(f"{Path(exp.path).name}:{exp.line}")
        if not matched or not any(c.outcome == "unexpected-pass" for c in matched):
            continue
        still = sorted({c.nodeid for c in matched if c.outcome != "unexpected-pass"})
        if still:
            notes.append(
                f"{exp.location}: some tests now pass but {len(still)} still match and fail "
                f"(e.g. {still[0]}); narrow `test: {exp.test}`"
            )
        elif exp.line in spans:
            remove.append(spans[exp.line])
    new_failures: dict[str, tuple[str, list[str]]] = {}
    for case in cases:
        if case.expectation is None and case.outcome in ("failed", "error", "crash"):
            status = {"failed": "fail"}.get(case.outcome, case.outcome)
            _, lanes = new_failures.setdefault(case.nodeid, (status, []))
            if case.lane in matrix.lanes and case.lane not in lanes:
                lanes.append(case.lane)
    lacked = sorted(k for k, v in (caps or {}).items() if not is_present(v))
    additions = [
        _new_entry(indent, nodeid, lanes, status, lacked)
        for nodeid, (status, lanes) in sorted(new_failures.items())
        if lanes  # lint "tests" and unknown lanes cannot take expectations
    ]
    for first, end in sorted(remove, reverse=True):
        del lines[first:end]
        if insert_at is not None and first < insert_at:
            insert_at -= end - first
    if additions:
        block = "\n".join(additions).splitlines()
        if insert_at is None:  # no entries yet: (re)write the `expectations:` key at the end
            lines = [ln for ln in lines if not ln.startswith("expectations:")]
            lines += ["", "expectations:", *block]
        else:
            lines[insert_at:insert_at] = block
    new_text = "\n".join(lines) + ("\n" if text.endswith("\n") else "")
    return new_text, notes


def main(
    matrix_file: Path, junit_dir: Path, write: bool = False, stream: TextIO | None = None
) -> int:
    """Print proposed matrix changes as a unified diff; with `write`, apply them atomically."""
    stream = stream or sys.stdout
    text = matrix_file.read_text(encoding="utf-8")
    matrix = parse(text, str(matrix_file))
    if not junit_dir.is_dir() or not any(junit_dir.glob("*.xml")):
        print(f"no junit XML in {junit_dir}; run `invoke test --matrix` first", file=stream)
        return 1
    summary = junit_dir.parent / "summary.json"
    caps = None
    if summary.is_file():
        try:
            caps = json.loads(summary.read_text(encoding="utf-8"))["capabilities"]
        except (ValueError, KeyError, TypeError):
            raise MatrixError(
                str(summary), 0, "not a matrix summary (capabilities missing); re-run the matrix"
            ) from None
    new_text, notes = propose(matrix, text, read_junit(junit_dir), caps)
    for note in notes:
        print(f"note: {note}", file=stream)
    if new_text == text:
        print("matrix.yaml: no expectation changes proposed", file=stream)
        return 0
    name = matrix_file.name
    stream.writelines(
        difflib.unified_diff(
            text.splitlines(keepends=True),
            new_text.splitlines(keepends=True),
            fromfile=f"a/{name}",
            tofile=f"b/{name}",
        )
    )
    if write:
        light.load("atomic").write_text(matrix_file, new_text)
        print(f"wrote {matrix_file}; replace every FIXME before the next run", file=stream)
    else:
        print("review the diff; apply it with `invoke matrix-update --write`", file=stream)
    return 0

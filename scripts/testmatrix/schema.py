"""Load and validate matrix.yaml before anything runs.

Every problem becomes one `MatrixError` whose text is `file:line: what is wrong; how to fix it`.
Line numbers come from PyYAML's node marks, so the file is composed into nodes and validated node
by node instead of being loaded into plain dicts (which forget where things came from).
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from scripts.testmatrix.capabilities import CAPABILITIES, is_present

LANE_KINDS = ("pytest", "ruff")
MAX_WORKERS = 256  # xdist forks every one at once: a typo of a few zeros must not fork-bomb
STATUSES = ("fail", "error", "crash")
PLACEHOLDER_REASON = re.compile(r"^\s*(FIXME|TODO|XXX|TBD)\b", re.IGNORECASE)
_LANE_NAME = re.compile(r"^[a-z][a-z0-9-]*$")
_REQUIREMENT = re.compile(r"^(not\s+)?([a-z][a-z0-9_]*)\s*(?:(==|!=|>=|<=|>|<)\s*(\S+))?$")


class MatrixError(Exception):
    """A matrix.yaml problem, rendered as one line `file:line: message`."""

    def __init__(self, path: str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path, self.line, self.message = path, line, message


def _version_key(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, bool):
        return (int(value),)
    if isinstance(value, int):
        return (value,)
    if isinstance(value, str) and re.fullmatch(r"v?\d+(\.\d+)*", value):
        return tuple(int(p) for p in value.lstrip("v").split("."))
    return None


@dataclass(frozen=True)
class Requirement:
    """`name` (present), `not name` (missing) or `name OP value` (==, !=, >=, <=, >, <)."""

    text: str
    name: str
    negate: bool = False
    op: str | None = None
    value: str | None = None

    def holds(self, caps: dict[str, Any]) -> bool:
        actual = caps.get(self.name)
        if self.op is None:
            result = is_present(actual)
        elif self.op in ("==", "!="):
            same = str(actual).lower() == str(self.value).lower()
            if not same and _version_key(actual) is not None:
                same = _version_key(actual) == _version_key(self.value)
            result = same if self.op == "==" else not same
        else:
            left, right = _version_key(actual), _version_key(self.value)
            if left is None or right is None:
                result = False  # "box64 >= 0.4.0" with no box64 at all is simply unmet
            else:
                result = {">=": left >= right, "<=": left <= right, ">": left > right}.get(
                    self.op, left < right
                )
        return not result if self.negate else result


# A lane `on_board` runs here on a board; a machine of another architecture hands it to the
# emulated board, which needs the lab.
BOARD_ARCH = "aarch64"
DELEGATION_REQUIRES = (Requirement("lab", "lab"),)


@dataclass
class Lane:
    name: str
    line: int
    kind: str = "pytest"
    paths: list[str] = field(default_factory=list)
    keyword: str | None = None
    markers: str | None = None
    requires: list[Requirement] = field(default_factory=list)
    workers: int = 1
    timeout: float = 600.0
    test_timeout: float | None = None  # per test (pytest-timeout); None: no per-test limit
    env: dict[str, str] = field(default_factory=dict)
    description: str = ""
    # A lane of tests that run on a board: on an aarch64 machine (a board) here, elsewhere on the
    # emulated board booted from this lab image (scripts/lab/images.py). None: here.
    on_board: str | None = None

    def delegated(self, caps: dict[str, Any]) -> bool:
        """Whether this machine hands the lane to the emulated board instead of running it."""
        return self.on_board is not None and caps.get("arch") != BOARD_ARCH

    def missing(self, caps: dict[str, Any]) -> list[str]:
        """Requirement texts this machine does not meet (empty: the lane can run)."""
        requires = [*self.requires, *(DELEGATION_REQUIRES if self.delegated(caps) else ())]
        return [r.text for r in requires if not r.holds(caps)]


@dataclass
class Expectation:
    test: str
    lanes: list[str]
    status: str
    reason: str
    link: str
    path: str
    line: int
    any_missing: list[Requirement] = field(default_factory=list)
    all_present: list[Requirement] = field(default_factory=list)
    match: str | None = None

    @property
    def location(self) -> str:
        return f"{self.path}:{self.line}"

    def active(self, lane: str, caps: dict[str, Any]) -> bool:
        """Does this entry apply to `lane` on a machine with `caps`?"""
        if lane not in self.lanes:
            return False
        if self.any_missing and all(r.holds(caps) for r in self.any_missing):
            return False
        return all(r.holds(caps) for r in self.all_present)

    def matches(self, nodeid: str) -> bool:
        # Exact ids first: parametrized ids contain [..] which fnmatch reads as a character class.
        if nodeid == self.test:
            return True
        target = nodeid if "::" in self.test else nodeid.split("::", 1)[0]
        return fnmatch.fnmatchcase(target, self.test)


@dataclass
class Matrix:
    path: str
    lanes: dict[str, Lane]
    expectations: list[Expectation]


class _Validator:
    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, node: yaml.Node, message: str) -> MatrixError:
        return MatrixError(self.path, node.start_mark.line + 1, message)

    def mapping(self, node: yaml.Node, what: str, allowed: dict[str, bool]) -> dict[str, yaml.Node]:
        """Mapping node -> {key: value node}; `allowed` maps key -> required."""
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, f"{what} must be a mapping of keys to values")
        out: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key is None or key not in allowed:
                raise self.fail(
                    key_node,
                    f"{what}: unknown key {key!r}; use one of: {', '.join(allowed)}",
                )
            if key in out:
                raise self.fail(key_node, f"{what}: duplicate key {key!r}; keep only one")
            out[key] = value_node
        for key, required in allowed.items():
            if required and key not in out:
                raise self.fail(node, f"{what}: missing required key {key!r}")
        return out

    def scalar(self, node: yaml.Node, what: str) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, f"{what} must be a single value, not a list or mapping")
        # Constructed directly: re-serializing an empty value (`timeout:`) does not parse back.
        return yaml.constructor.SafeConstructor().construct_object(node, deep=True)

    def string(self, node: yaml.Node, what: str) -> str:
        value = self.scalar(node, what)
        if not isinstance(value, str) or not value.strip():
            raise self.fail(node, f"{what} must be a non-empty string, got {value!r}")
        return value

    def number(
        self, node: yaml.Node, what: str, minimum: float, integer: bool, maximum: float = math.inf
    ) -> Any:
        value = self.scalar(node, what)
        kinds = (int,) if integer else (int, float)
        # NaN compares false with everything (a timeout that never expires); inf never ends.
        if (
            isinstance(value, bool)
            or not isinstance(value, kinds)
            or not math.isfinite(value)
            or not minimum <= value <= maximum
        ):
            kind = "an integer" if integer else "a number"
            limit = f" and <= {maximum:g}" if maximum != math.inf else ""
            raise self.fail(node, f"{what} must be {kind} >= {minimum}{limit}, got {value!r}")
        return value

    def strings(self, node: yaml.Node, what: str) -> list[tuple[str, yaml.Node]]:
        if isinstance(node, yaml.ScalarNode):  # a lone string is a one-element list
            return [(self.string(node, what), node)]
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            raise self.fail(node, f"{what} must be a non-empty list of strings")
        return [(self.string(item, what), item) for item in node.value]

    def requirement(self, text: str, node: yaml.Node, what: str) -> Requirement:
        match = _REQUIREMENT.match(text.strip())
        if not match:
            raise self.fail(
                node, f"{what}: cannot parse {text!r}; write `name`, `not name` or `name >= value`"
            )
        negate, name, op, value = match.groups()
        if name not in CAPABILITIES:
            raise self.fail(
                node,
                f"{what}: unknown capability {name!r}; known: {', '.join(sorted(CAPABILITIES))}",
            )
        return Requirement(text.strip(), name, bool(negate), op, value)

    def lane(self, name: str, key_node: yaml.Node, node: yaml.Node) -> Lane:
        what = f"lane {name!r}"
        if not _LANE_NAME.match(name):
            raise self.fail(key_node, f"{what}: names are lowercase words joined by '-'")
        keys = self.mapping(
            node,
            what,
            {
                "description": False,
                "kind": False,
                "paths": True,
                "keyword": False,
                "markers": False,
                "requires": False,
                "workers": False,
                "timeout": True,
                "test_timeout": False,
                "env": False,
                "on_board": False,
            },
        )
        lane = Lane(name=name, line=key_node.start_mark.line + 1)
        if "on_board" in keys:
            from scripts.lab.images import IMAGES

            lane.on_board = self.string(keys["on_board"], f"{what} on_board")
            if lane.on_board not in IMAGES:
                raise self.fail(
                    keys["on_board"],
                    f"{what}: on_board names a lab image, one of: {', '.join(sorted(IMAGES))}",
                )
        if "kind" in keys:
            lane.kind = self.string(keys["kind"], f"{what} kind")
            if lane.kind not in LANE_KINDS:
                raise self.fail(keys["kind"], f"{what}: kind must be one of {LANE_KINDS}")
        lane.paths = [s for s, _ in self.strings(keys["paths"], f"{what} paths")]
        for key in ("keyword", "markers", "description"):
            if key in keys:
                setattr(lane, key, self.string(keys[key], f"{what} {key}"))
        if "requires" in keys:
            lane.requires = [
                self.requirement(text, item, f"{what} requires")
                for text, item in self.strings(keys["requires"], f"{what} requires")
            ]
        if "workers" in keys:
            lane.workers = self.number(
                keys["workers"], f"{what} workers", 1, integer=True, maximum=MAX_WORKERS
            )
        lane.timeout = float(self.number(keys["timeout"], f"{what} timeout (seconds)", 1, False))
        if "test_timeout" in keys:
            lane.test_timeout = float(
                self.number(keys["test_timeout"], f"{what} test_timeout (seconds)", 1, False)
            )
            if lane.kind == "ruff":
                raise self.fail(keys["test_timeout"], f"{what}: a ruff lane runs no tests")
            if lane.test_timeout >= lane.timeout:
                raise self.fail(
                    keys["test_timeout"],
                    f"{what}: test_timeout {lane.test_timeout:g}s must be below the lane "
                    f"timeout {lane.timeout:g}s, or one hung test still loses the whole lane",
                )
        if "env" in keys:
            env_node = keys["env"]
            if not isinstance(env_node, yaml.MappingNode):
                raise self.fail(env_node, f"{what} env must be a mapping NAME: value")
            for k, v in env_node.value:
                name = self.string(k, f"{what} env name")
                value = self.scalar(v, f"{what} env {name}")
                if value is None or isinstance(value, bool):  # would arrive as "None"/"True"
                    raise self.fail(
                        v, f"{what} env {name} must be a string or number; quote it, got {value!r}"
                    )
                lane.env[name] = str(value)
        if lane.kind == "ruff" and lane.on_board:
            raise self.fail(keys["on_board"], f"{what}: a ruff lane runs here; remove on_board")
        if lane.kind == "ruff" and lane.workers != 1:
            raise self.fail(keys["workers"], f"{what}: a ruff lane has no workers; remove it")
        return lane

    def expectation(self, node: yaml.Node, index: int, lanes: dict[str, Lane]) -> Expectation:
        what = f"expectation #{index + 1}"
        keys = self.mapping(
            node,
            what,
            {
                "test": True,
                "lanes": True,
                "when": False,
                "status": True,
                "match": False,
                "reason": True,
                "link": True,
            },
        )
        test = self.string(keys["test"], f"{what} test")
        lane_names = []
        for lane_name, item in self.strings(keys["lanes"], f"{what} lanes"):
            if lane_name not in lanes:
                raise self.fail(item, f"{what}: no lane {lane_name!r}; known: {', '.join(lanes)}")
            if lanes[lane_name].kind != "pytest":
                raise self.fail(item, f"{what}: lane {lane_name!r} runs no pytest tests")
            lane_names.append(lane_name)
        status = self.string(keys["status"], f"{what} status")
        if status not in STATUSES:
            raise self.fail(keys["status"], f"{what}: status must be one of {', '.join(STATUSES)}")
        reason = self.string(keys["reason"], f"{what} reason")
        if PLACEHOLDER_REASON.match(reason):
            raise self.fail(keys["reason"], f"{what}: reason is a placeholder; say why it fails")
        exp = Expectation(
            test=test,
            lanes=lane_names,
            status=status,
            reason=reason,
            link=self.string(keys["link"], f"{what} link"),
            path=self.path,
            line=node.start_mark.line + 1,
        )
        if "match" in keys:
            exp.match = self.string(keys["match"], f"{what} match")
            try:
                re.compile(exp.match)
            except re.error as err:
                raise self.fail(
                    keys["match"], f"{what}: match is not a valid regex ({err})"
                ) from None
        if "when" in keys:
            when = self.mapping(
                keys["when"], f"{what} when", {"any_missing": False, "all_present": False}
            )
            for key, target in (("any_missing", exp.any_missing), ("all_present", exp.all_present)):
                if key in when:
                    for text, item in self.strings(when[key], f"{what} when.{key}"):
                        target.append(self.requirement(text, item, f"{what} when.{key}"))
        return exp

    def matrix(self, root: yaml.Node | None) -> Matrix:
        if root is None:
            raise MatrixError(self.path, 1, "file is empty; it needs `version: 1` and `lanes:`")
        keys = self.mapping(
            root, "matrix file", {"version": True, "lanes": True, "expectations": False}
        )
        if self.scalar(keys["version"], "version") != 1:
            raise self.fail(keys["version"], "version must be 1 (the only schema version)")
        lanes_node = keys["lanes"]
        if not isinstance(lanes_node, yaml.MappingNode) or not lanes_node.value:
            raise self.fail(lanes_node, "lanes must be a non-empty mapping of lane name -> lane")
        lanes: dict[str, Lane] = {}
        for key_node, value_node in lanes_node.value:
            name = str(self.scalar(key_node, "lane name"))
            if name in lanes:
                raise self.fail(key_node, f"duplicate lane {name!r}; keep only one")
            lanes[name] = self.lane(name, key_node, value_node)
        expectations: list[Expectation] = []
        if "expectations" in keys:
            exp_node = keys["expectations"]
            if isinstance(exp_node, yaml.ScalarNode) and exp_node.value in ("", "~", "null"):
                exp_node = yaml.SequenceNode("tag:yaml.org,2002:seq", [])
            if not isinstance(exp_node, yaml.SequenceNode):
                raise self.fail(exp_node, "expectations must be a list of entries")
            for index, item in enumerate(exp_node.value):
                expectations.append(self.expectation(item, index, lanes))
        return Matrix(path=self.path, lanes=lanes, expectations=expectations)


def parse(text: str, path: str = "matrix.yaml") -> Matrix:
    """Validate matrix text; raises MatrixError (one line, file:line) on any problem."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark else 1
        raise MatrixError(
            path, line, f"YAML syntax error: {err.problem}; fix the indentation or quoting"
        ) from None
    except yaml.YAMLError as err:
        # e.g. a control character: PyYAML's text spans lines; the error stays one line.
        raise MatrixError(path, 1, "YAML error: " + " ".join(str(err).split())) from None
    return _Validator(path).matrix(root)


def load(path: str | Path) -> Matrix:
    """Read and validate a matrix file; a missing file is a MatrixError too."""
    shown = str(path)
    try:  # errors name the file the way the user would type it
        shown = str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        pass
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise MatrixError(
            shown, 0, f"cannot read matrix file ({err.strerror}); pass --file PATH"
        ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise MatrixError(
            shown, line, f"not UTF-8 text (byte {err.start}); save the file as UTF-8"
        ) from None
    return parse(text, shown)

"""Find import cycles among the repository's own modules, statically (from `ast`, nothing runs).

Every `import`/`from ... import` counts, wherever it stands (a function-local import still ties
the two modules together), and counts strictly: each namespace it reads is an edge, so `import
pkg.mod` and `from pkg import mod` depend on pkg's __init__ as well as on pkg.mod (see
`_imported`). A cycle is a strongly connected component of more than one module.

It also checks the layering (docs/architecture.md): the tooling's layers are stacked, lowest
first, in `LAYERS`, and a module may import its own layer and those below, never one above;
provision.floor imports only the standard library; torch_fl imports none of the tooling.

    python scripts/check_imports.py [REPO]      # exit 1, one line per new cycle or upward import

The lint lane runs it (scripts/testmatrix/runner.py), the unit lane tests it.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOTS = ("torch_fl", "provision", "scripts")

# Cycles that exist and are being taken apart; each entry goes once its cycle is gone (main()
# says so). Any other cycle fails the check.
KNOWN_CYCLES: frozenset[tuple[str, ...]] = frozenset()

# The tooling's layers, lowest first: a module may import its own layer and the ones below.
# scripts/ may use provisioning (and its target), provisioning never the invoke tasks or the
# matrix, and the floor nothing of either. A module belongs to the longest prefix it matches.
LAYERS: tuple[str, ...] = ("provision.floor", "provision", "scripts")
# Packages that stand apart: they import nothing of the layers (the layers reach torch_fl's
# standard-library-only files by path, provision/floor/light.py, or import it where torch is
# meant to be there).
SEPARATE: tuple[str, ...] = ("torch_fl",)
STDLIB_ONLY: tuple[str, ...] = ("provision.floor",)  # may import nothing outside the stdlib

Graph = dict[str, set[str]]
Bindings = Mapping[str, "set[str] | None"]


def module_name(path: Path, repo: Path) -> str:
    parts = list(path.relative_to(repo).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def find_modules(repo: Path, roots: Iterable[str] = ROOTS) -> dict[str, Path]:
    """{dotted name: file} of every .py file under the given top-level packages."""
    found: dict[str, Path] = {}
    for root in roots:
        for path in sorted((repo / root).rglob("*.py")):
            found[module_name(path, repo)] = path
    return found


def _from_base(node: ast.ImportFrom, package: str) -> str:
    base = node.module or ""
    if node.level:  # relative: `from . import x`, `from ..a import b`
        parts = package.split(".")
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([base] if base else []))
    return base


def package_bindings(name: str, tree: ast.Module) -> set[str] | None:
    """Names a package's __init__ binds itself (defs, assignments, imports from elsewhere).

    None when it cannot be told statically (a star import). Names it imports from the package
    itself (`from pkg import _C`) are submodules, not its own attributes.
    """
    bound: set[str] = set()
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        stmt = todo.pop()
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(stmt.name)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                bound.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(stmt, ast.Import):
            bound.update(a.asname or a.name.split(".")[0] for a in stmt.names)
        elif isinstance(stmt, ast.ImportFrom):
            if any(a.name == "*" for a in stmt.names):
                return None
            if _from_base(stmt, name) != name:
                bound.update(a.asname or a.name for a in stmt.names)
        else:  # if/try/with blocks at module level bind names too
            for field in ("body", "orelse", "finalbody", "handlers"):
                todo.extend(getattr(stmt, field, None) or [])
    return bound


def _ours(name: str, modules: Mapping[str, Path]) -> str:
    """The module of ours a dotted name lies in (`a.b.func` -> `a.b`); "" when none."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def _extension(name: str, modules: Mapping[str, Path], bindings: Bindings) -> bool:
    """Whether `name` is a compiled submodule of one of our packages (torch_fl._C): no source,
    so it imports nothing of ours, and the package's __init__ does not bind it itself."""
    parent, _, last = name.rpartition(".")
    if name in modules or parent not in bindings:
        return False
    bound = bindings[parent]
    return bound is not None and last not in bound


def _imported(
    node: ast.AST,
    package: str,
    modules: Mapping[str, Path],
    bindings: Bindings | None = None,
) -> list[str]:
    """The modules of ours one import statement makes its module depend on, counted strictly.

    Every namespace the statement reads is an edge, because that module must have run first:
    `import a.b.c` (with or without `as`) reads `a`, then `a.b`, then `a.b.c`; `from a.b import
    c` reads `a.b` (and runs `a.b.c` when that is a submodule). So a submodule that imports a
    sibling as `from pkg import sibling` depends on pkg's __init__; one that imports names from
    the sibling itself (`from pkg.sibling import name`) does not.
    """
    bindings = bindings or {}
    if isinstance(node, ast.Import):
        found = []
        for alias in node.names:
            parts = alias.name.split(".")
            found += [".".join(parts[: n + 1]) for n in range(len(parts))]
        return [_ours(name, modules) for name in found]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = _from_base(node, package)
    if _extension(base, modules, bindings):
        return []  # `from pkg._C import f`: the extension's own namespace
    found = [_ours(base, modules)]
    found += [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
    return found


def build_graph(modules: Mapping[str, Path]) -> Graph:
    """Module -> the modules of ours it imports."""
    trees: dict[str, ast.Module] = {}
    for name, path in modules.items():
        try:
            trees[name] = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except (SyntaxError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: cannot parse it ({exc}); fix the file first") from exc
    bindings = {
        name: package_bindings(name, trees[name])
        for name, path in modules.items()
        if path.name == "__init__.py"
    }
    graph: Graph = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(trees[name]):
            for target in _imported(node, package, modules, bindings):
                if target and target != name:
                    graph[name].add(target)
    return graph


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def layer_of(name: str) -> int | None:
    """The index in LAYERS of the layer `name` belongs to (the longest prefix); None if none."""
    matches = [i for i, prefix in enumerate(LAYERS) if _within(name, prefix)]
    return max(matches, key=lambda i: len(LAYERS[i])) if matches else None


def upward_imports(graph: Mapping[str, set[str]]) -> list[str]:
    """One line per import that goes up the layering, or from a separate package into it."""
    found = []
    for name in sorted(graph):
        mine = layer_of(name)
        for target in sorted(graph[name]):
            theirs = layer_of(target)
            if theirs is None:
                continue
            if any(_within(name, root) for root in SEPARATE):
                found.append(f"{name} imports {target}: {name.split('.')[0]} imports no tooling")
            elif mine is not None and theirs > mine:
                found.append(
                    f"{name} imports {target}: {LAYERS[mine]} is below {LAYERS[theirs]} "
                    f"(layers, lowest first: {' < '.join(LAYERS)})"
                )
    return found


def non_stdlib_imports(repo: Path, modules: Mapping[str, Path]) -> list[str]:
    """One line per import outside the standard library in a STDLIB_ONLY package."""
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    found = []
    for name, path in sorted(modules.items()):
        floor = next((root for root in STDLIB_ONLY if _within(name, root)), None)
        if floor is None:
            continue
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            for target in _raw_targets(node, package):
                if target.split(".")[0] not in allowed and not _within(target, floor):
                    found.append(f"{name} imports {target}: {floor} imports only the stdlib")
    return found


def _raw_targets(node: ast.AST, package: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        return [_from_base(node, package)]
    return []


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def check(repo: Path, roots: Iterable[str] = ROOTS) -> list[list[str]]:
    return cycles(build_graph(find_modules(repo, roots)))


def check_layers(repo: Path, roots: Iterable[str] = ROOTS) -> list[str]:
    """Every upward import and every non-stdlib import of the floor, one line each."""
    modules = find_modules(repo, roots)
    return upward_imports(build_graph(modules)) + non_stdlib_imports(repo, modules)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    repo = Path(args[0] if args else Path(__file__).resolve().parents[1]).resolve()
    if not repo.is_dir():
        print(f"{repo} is not a directory; give the repository root", file=sys.stderr)
        return 2
    try:
        found = {tuple(component) for component in check(repo)}
        layering = check_layers(repo)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    for component in sorted(found & KNOWN_CYCLES):
        print("known import cycle among: " + ", ".join(component))
    for component in sorted(KNOWN_CYCLES - found):
        print("gone (remove it from KNOWN_CYCLES): " + ", ".join(component))
    new = sorted(found - KNOWN_CYCLES)
    for component in new:
        print("import cycle among: " + ", ".join(component))
    for line in layering:
        print("upward import: " + line)
    print(f"{len(new)} new import cycle(s) in {', '.join(ROOTS)}")
    print(f"{len(layering)} import(s) against the layering ({' < '.join(LAYERS)})")
    return 1 if new or layering else 0


if __name__ == "__main__":
    sys.exit(main())

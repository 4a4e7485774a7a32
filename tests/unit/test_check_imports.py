"""scripts/check_imports.py finds import cycles, and the repository has none beyond known ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts import check_imports

REPO = Path(__file__).resolve().parents[2]


def _package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_finds_cycle_through_absolute_relative_and_local_imports(tmp_path):
    repo = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import thing\n",
            "pkg/b.py": "def thing():\n    from . import c\n",  # function-local, relative
            "pkg/c.py": "import pkg.a\n",
            "pkg/leaf.py": "import os\nfrom pkg import a\n",  # imports into the cycle only
            "pkg/sub/__init__.py": "from ..leaf import os\n",
        },
    )
    found = check_imports.check(repo, roots=("pkg",))
    assert found == [["pkg.a", "pkg.b", "pkg.c"]]
    assert check_imports.main([str(repo)]) == 0  # ROOTS are the repository's, not pkg


def test_acyclic_package_and_self_import(tmp_path):
    repo = _package(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg import a\n",  # a package importing its submodule
            "pkg/a.py": "from pkg.a import y\nfrom pkg.b import x\ny = 1\n",
            "pkg/b.py": "x = 1\n",
        },
    )
    graph = check_imports.build_graph(check_imports.find_modules(repo, ("pkg",)))
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": set()}
    assert check_imports.cycles(graph) == []


@pytest.mark.parametrize(
    "statement",
    ["from pkg import b", "from . import b", "import pkg.b", "import pkg.b as b"],
)
def test_strict_a_submodule_reached_through_its_package_is_an_edge_to_the_package(
    tmp_path, statement
):
    # The package's __init__ re-exports a, and a reaches its sibling b through the package:
    # each form reads pkg's namespace, so a depends on pkg while pkg depends on a. Counting only
    # a -> pkg.b (as the check once did) would hide that cycle.
    repo = _package(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import f\n",
            "pkg/a.py": f"{statement}\n\ndef f():\n    return 1\n",
            "pkg/b.py": "x = 1\n",
        },
    )
    graph = check_imports.build_graph(check_imports.find_modules(repo, ("pkg",)))
    assert graph["pkg.a"] == {"pkg", "pkg.b"}
    assert check_imports.check(repo, roots=("pkg",)) == [["pkg", "pkg.a"]]


def test_strict_importing_names_from_the_sibling_itself_is_no_cycle(tmp_path):
    repo = _package(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import f\n",
            "pkg/a.py": "from pkg.b import x\n\ndef f():\n    return x\n",
            "pkg/b.py": "x = 1\n",
        },
    )
    assert check_imports.check(repo, roots=("pkg",)) == []


def test_extension_submodule_is_not_the_package(tmp_path):
    # `from pkg._C import f` reads a compiled submodule (no .py), which imports nothing of ours;
    # `from pkg import _C` reads pkg's own namespace first, so it is an edge to pkg
    repo = _package(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg import _C, dev\nVERSION = 1\n",
            "pkg/dev.py": "from pkg._C import fn\n",
            "pkg/ext_user.py": "from pkg import _C\n",
            "pkg/user.py": "from pkg import VERSION\n",  # an attribute of __init__: an edge
        },
    )
    graph = check_imports.build_graph(check_imports.find_modules(repo, ("pkg",)))
    assert graph == {
        "pkg": {"pkg.dev"},
        "pkg.dev": set(),
        "pkg.ext_user": {"pkg"},
        "pkg.user": {"pkg"},
    }


def test_star_import_in_init_keeps_the_package_edge(tmp_path):
    repo = _package(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.dev import *\n",
            "pkg/dev.py": "from pkg import anything\n",
        },
    )
    assert check_imports.check(repo, roots=("pkg",)) == [["pkg", "pkg.dev"]]


def test_two_module_cycle_reported_by_main(tmp_path, capsys, monkeypatch):
    repo = _package(
        tmp_path,
        {
            "scripts/__init__.py": "",
            "scripts/x.py": "import scripts.y\n",
            "scripts/y.py": "import scripts.x\n",
        },
    )
    assert check_imports.main([str(repo)]) == 1
    assert "scripts.x, scripts.y" in capsys.readouterr().out


def test_repository_has_no_new_import_cycles(capsys):
    assert check_imports.main([str(REPO)]) == 0, capsys.readouterr().out


def test_bad_input_is_named(tmp_path, capsys):
    assert check_imports.main([str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "broken.py").write_text("def f(:\n")
    assert check_imports.main([str(tmp_path)]) == 2
    assert "broken.py: cannot parse" in capsys.readouterr().err


def test_layering_finds_upward_imports(tmp_path, capsys):
    repo = _package(
        tmp_path,
        {
            "provision/__init__.py": "",
            "provision/floor/__init__.py": "",
            "provision/floor/codes.py": "import signal\nfrom provision.floor import paths\n",
            "provision/floor/paths.py": "def helper():\n    from provision import plan\n",
            "provision/plan.py": "from provision.floor import codes\nfrom scripts import tool\n",
            "scripts/__init__.py": "",
            "scripts/tool.py": "from provision import plan\nfrom provision.floor import codes\n",
            "torch_fl/__init__.py": "",
            "torch_fl/env.py": "from provision.floor import codes\n",
        },
    )
    graph = check_imports.build_graph(check_imports.find_modules(repo))
    found = check_imports.upward_imports(graph)
    assert [line.split(":")[0] for line in found] == [
        "provision.floor.paths imports provision",  # a function-local import counts too
        "provision.floor.paths imports provision.plan",
        "provision.plan imports scripts",
        "provision.plan imports scripts.tool",
        "torch_fl.env imports provision.floor",
        "torch_fl.env imports provision.floor.codes",
    ]
    assert check_imports.main([str(repo)]) == 1
    out = capsys.readouterr().out
    assert "upward import: provision.plan imports scripts.tool: provision is below scripts" in out


def test_the_floor_imports_only_the_standard_library(tmp_path):
    repo = _package(
        tmp_path,
        {
            "provision/__init__.py": "",
            "provision/floor/__init__.py": "",
            "provision/floor/ok.py": "from __future__ import annotations\nimport os.path\n"
            "from . import other\n",
            "provision/floor/other.py": "import yaml\n",
        },
    )
    assert check_imports.check_layers(repo) == [
        "provision.floor.other imports yaml: provision.floor imports only the stdlib"
    ]

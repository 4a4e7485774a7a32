"""The extension's build follows the torch it builds against (torch_fl/build_flags.py).

The C++ standard comes from torch's own header guards, pybind11 from wherever this kind of torch
keeps it, and a missing header or tool is named with its fix before anything compiles. The
installed extension must have been built with the standard the installed torch demands.
"""

from __future__ import annotations

import importlib.util
import json
import runpy
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# By file, without importing the torch_fl package (whose import needs the built extension); from
# wherever torch_fl is: the checkout here, the installed library on a board (the board-torch
# lane ships no torch_fl/ beside its tests).
flags_mod = runpy.run_path(
    str(Path(importlib.util.find_spec("torch_fl").origin).parent / "build_flags.py")
)
BuildSetupError = flags_mod["BuildSetupError"]


def _fake_torch(root: Path, guard: str | None, pybind: bool) -> Path:
    """An include tree shaped like torch's: ATen/ATen.h with `guard`, optionally pybind11."""
    (root / "ATen").mkdir(parents=True)
    text = "#pragma once\n"
    if guard:
        text += f"#if !defined(_MSC_VER) && __cplusplus < {guard}\n#error too old\n#endif\n"
    (root / "ATen" / "ATen.h").write_text(text)
    if pybind:
        (root / "pybind11").mkdir()
        (root / "pybind11" / "pybind11.h").write_text("#pragma once\n")
    return root


@pytest.mark.board
@pytest.mark.parametrize(
    ("guard", "standard"),
    [("201703L", "c++17"), ("202002L", "c++20"), ("202302L", "c++23"), (None, "c++17")],
)
def test_standard_is_read_from_the_headers_guards(tmp_path: Path, guard, standard) -> None:
    root = _fake_torch(tmp_path / "inc", guard, pybind=True)
    assert flags_mod["required_standard"]([str(root)]) == standard


@pytest.mark.board
def test_installed_torch_and_the_built_extension_agree() -> None:
    """Fails when the extension was built with other flags than the installed torch needs."""
    from torch.utils.cpp_extension import include_paths

    import torch_fl

    # Debian's torch keeps its headers under /usr/include, not in include_paths()'s torch/include.
    needed = flags_mod["required_standard"](flags_mod["torch_header_dirs"](include_paths()))
    built = json.loads((Path(torch_fl.__file__).parent / "_build_config.json").read_text())
    assert built.get("cxx_standard") == needed, (built, needed)
    flags = flags_mod["flags_for"](include_paths(), check_compiler=False)
    assert flags.cxx_standard == needed
    setup = (REPO / "setup.py").read_text()  # the checkout's (the board gets it too)
    assert '"-std=c++17"' not in setup  # the standard is never hard-coded again


@pytest.mark.board
def test_torch_headers_are_found_where_a_distribution_keeps_them(tmp_path: Path, monkeypatch):
    find = flags_mod["torch_header_dirs"]
    system = tmp_path / "usr-include"
    system.mkdir()
    monkeypatch.setitem(find.__globals__, "_system_include_dirs", lambda: [str(system)])
    bare = tmp_path / "torch-include"  # a torch/include without the headers (Debian's)
    bare.mkdir()
    with pytest.raises(BuildSetupError, match="no ATen/ATen.h in .*apt-get install libtorch-dev"):
        find([str(bare)])
    _fake_torch(system, "202002L", pybind=False)  # libtorch-dev installed: /usr/include/ATen
    dirs = find([str(bare)])
    assert dirs == [str(bare), str(system)]
    assert flags_mod["required_standard"](dirs) == "c++20"


def test_missing_pybind11_names_the_fix(tmp_path: Path, monkeypatch) -> None:
    root = _fake_torch(tmp_path / "inc", "202002L", pybind=False)
    monkeypatch.setitem(sys.modules, "pybind11", None)  # no pip package either
    find = flags_mod["_pybind11_dirs"]
    if Path("/usr/include/pybind11/pybind11.h").exists():
        pytest.skip("this machine has system pybind11 headers")
    with pytest.raises(BuildSetupError, match="pybind11-dev.*pip install pybind11"):
        find([str(root)])
    bundled = _fake_torch(tmp_path / "inc2", "202002L", pybind=True)
    assert find([str(bundled)]) == ((), "pybind11: bundled with torch")


@pytest.mark.board
def test_missing_compiler_names_the_fix(tmp_path: Path, monkeypatch) -> None:
    root = _fake_torch(tmp_path / "inc", "201703L", pybind=True)
    monkeypatch.setenv("CXX", "no-such-compiler-x")
    with pytest.raises(BuildSetupError, match="no-such-compiler-x.*apt-get install g\\+\\+"):
        flags_mod["flags_for"]([str(root)])


def test_compiler_that_lacks_the_standard_is_refused(tmp_path: Path) -> None:
    assert flags_mod["compiler_accepts"]("c++", "c++17") is None
    failure = flags_mod["compiler_accepts"]("c++", "c++99")  # not a C++ standard at all
    assert failure and "c++99" in failure

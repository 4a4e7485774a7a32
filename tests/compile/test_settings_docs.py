"""The option table in docs/compile.md and the variable table in docs/env-vars.md match the code.

Every settings field is documented with its environment variable, and nothing is documented
that does not exist.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from torch_fl.bpu import settings

REPO = Path(__file__).resolve().parents[2]
CODE_DIRS = ("torch_fl", "provision", "scripts")


def table(path: Path, header: str) -> list[list[str]]:
    """The rows (cells, stripped of backticks) of the markdown table that starts with `header`."""
    lines = path.read_text(encoding="utf-8").splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip().startswith(header)]
    assert len(starts) == 1, f"{path.name}: expected one table headed {header!r}"
    rows = []
    for line in lines[starts[0] + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip().replace("`", "") for c in line.strip().strip("|").split("|")])
    return rows


def option_rows() -> list[tuple[list[str], set[str]]]:
    """docs/compile.md: (options named in a row, env variables named in it)."""
    rows = []
    for cells in table(REPO / "docs" / "compile.md", "| option | default | env | meaning |"):
        names = [n.strip() for n in cells[0].split("/")]
        envs = set(re.findall(r"FLAGOS_[A-Z0-9_]+", cells[2]))
        rows.append((names, envs))
    return rows


def env_rows() -> dict[str, str]:
    """docs/env-vars.md: variable -> its 'used by' cell."""
    rows = table(REPO / "docs" / "env-vars.md", "| variable | used by | default | meaning |")
    return {cells[0]: cells[1] for cells in rows}


FIELDS = [f.name for f in dataclasses.fields(settings.BpuSettings)]


def test_tables_found():
    # a parser that finds no rows would pass everything below
    assert len(option_rows()) >= 15 and len(env_rows()) >= 15


def test_every_option_documented_once_and_nothing_else():
    documented = [name for names, _ in option_rows() for name in names]
    assert sorted(documented) == sorted(FIELDS)


@pytest.mark.parametrize("row", range(len(option_rows())))
def test_option_row_names_exactly_its_env_variables(row):
    names, envs = option_rows()[row]
    assert envs == {settings.option(n).env for n in names if settings.option(n).env}, names


def test_every_setting_variable_in_env_vars_md():
    documented = env_rows()
    for name in FIELDS:
        env = settings.option(name).env
        if env is not None:
            assert env in documented, f"{env} (option {name}) missing from docs/env-vars.md"
            assert documented[env] == "compile backend"


def test_every_documented_variable_exists_in_the_code():
    code = "\n".join(
        path.read_text(encoding="utf-8")
        for root in CODE_DIRS
        for path in (REPO / root).rglob("*.py")
    )
    code += (REPO / "setup.py").read_text(encoding="utf-8")
    unused = [variable for variable in env_rows() if f'"{variable}"' not in code]
    assert unused == [], f"docs/env-vars.md documents variables no code reads: {unused}"


def test_every_option_has_a_doc_and_allowed_values():
    for name in FIELDS:
        option = settings.option(name)
        assert option.doc.strip() and option.allowed.strip(), name
        assert option.env is None or option.env.startswith("FLAGOS_BPU_"), name

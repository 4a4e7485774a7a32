"""hbdk4_guest.py as provisioning uses it: the import check, and shims enabled by a .pth line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from provision.steps import x86_python

STANDIN = Path(__file__).resolve().parents[1] / "standins" / "hbdk4"


def _python(code_or_args: list[str], record: Path, site: Path | None = None):
    env = dict(os.environ, PYTHONPATH=str(STANDIN), HBDK4_STANDIN_RECORD=str(record))
    argv = [sys.executable]
    if site is not None:  # a site dir processed at start-up, .pth files included
        argv += [
            "-c",
            f"import site, runpy, sys; site.addsitedir({str(site)!r}); {code_or_args[0]}",
        ]
    else:
        argv += code_or_args
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def test_check_emulated_imports_with_shims(tmp_path):
    record = tmp_path / "record.json"
    proc = _python([str(x86_python.GUEST), "check", "1", ""], record)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["TFL_HBDK4", "4.0.0+standin"]
    seen = json.loads(record.read_text())
    assert seen["numba"].endswith("torch-fl-shim") and seen["torch"].endswith("torch-fl-shim")


def test_check_reports_usage_and_import_failure(tmp_path):
    proc = _python([str(x86_python.GUEST), "check", "yes", ""], tmp_path / "r")
    assert proc.returncode != 0 and "usage" in proc.stderr
    env_fail = dict(os.environ, HBDK4_STANDIN_FAIL="import", PYTHONPATH=str(STANDIN))
    proc = subprocess.run(
        [sys.executable, str(x86_python.GUEST), "check", "0", ""],
        env=env_fail,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "simulated import failure" in proc.stderr


def test_pth_line_enables_the_shims_at_start(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(x86_python.GUEST, site / x86_python.GUEST.name)
    (site / x86_python.SHIMS_PTH).write_text("import hbdk4_guest; hbdk4_guest.install_shims()\n")
    record = tmp_path / "record.json"
    proc = _python(["import hbdk4.compiler, numba; print(numba.__version__)"], record, site)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "0.0.0+torch-fl-shim"
    assert json.loads(record.read_text())["torch"].endswith("torch-fl-shim")

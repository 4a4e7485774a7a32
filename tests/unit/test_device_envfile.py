"""The per-user env file that provisioning writes (torch_fl/envfile.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from torch_fl import envfile


def test_parse_comments_quotes_and_export():
    text = "# comment\n\nFLAGOS_BPU_MARCH=nash-p\nexport FLAGOS_BPU_CACHE='/tmp/c d'\n"
    assert envfile.parse_env_text(text) == {
        "FLAGOS_BPU_MARCH": "nash-p",
        "FLAGOS_BPU_CACHE": "/tmp/c d",
    }


def test_bad_line_names_file_line_and_fix():
    with pytest.raises(ValueError, match=r"env:2: expected KEY=VALUE.*invoke provision"):
        envfile.parse_env_text("A=1\nthis is not valid\n", source="env")


def test_environment_beats_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    f = tmp_path / "env"
    f.write_text("FLAGOS_BPU_MARCH=nash-e\nFLAGOS_BPU_ACT_SCALE=0.1\n")
    monkeypatch.setenv("FLAGOS_BPU_ENV_FILE", str(f))
    monkeypatch.setenv("FLAGOS_BPU_MARCH", "nash-p")
    monkeypatch.delenv("FLAGOS_BPU_ACT_SCALE", raising=False)
    assert envfile.get("FLAGOS_BPU_MARCH") == "nash-p"
    assert envfile.get("FLAGOS_BPU_ACT_SCALE") == "0.1"
    assert envfile.get("FLAGOS_BPU_MISSING", "d") == "d"
    f.write_text("FLAGOS_BPU_ACT_SCALE=0.2\n")  # read at call time, not cached at import
    assert envfile.get("FLAGOS_BPU_ACT_SCALE") == "0.2"


def test_lookup_names_the_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    f = tmp_path / "env"
    f.write_text("# header\nFLAGOS_BPU_ACT_SCALE=0.1\n")
    monkeypatch.setenv("FLAGOS_BPU_ENV_FILE", str(f))
    monkeypatch.delenv("FLAGOS_BPU_ACT_SCALE", raising=False)
    assert envfile.lookup("FLAGOS_BPU_ACT_SCALE") == ("0.1", f"{f}:2")
    monkeypatch.setenv("FLAGOS_BPU_ACT_SCALE", "0.3")
    assert envfile.lookup("FLAGOS_BPU_ACT_SCALE") == ("0.3", "$FLAGOS_BPU_ACT_SCALE")
    assert envfile.lookup("FLAGOS_BPU_MISSING") == (None, "")


def test_default_location_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.delenv("FLAGOS_BPU_ENV_FILE", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert envfile.env_file_path() == tmp_path / "torch-fl" / "env"
    assert envfile.load_env_file() == {}


MALFORMED = {
    "line_without_equals": (b"FLAGOS_BPU_MARCH=nash-e\nthis is not a setting\n", ":2:"),
    "not_utf8": (b"FLAGOS_BPU_MARCH=nash-e\nFLAGOS_BPU_CACHE=/tmp/\xff\xfe\n", ":2:"),
    "binary": (bytes(range(256)) * 4, ":1:"),
    "directory": (None, "is a directory"),
}

PROBE = (
    "import warnings, torch, torch_fl\n"
    "from torch_fl import envfile\n"
    "print('MARCH', envfile.get('FLAGOS_BPU_MARCH'))\n"
    "envfile.get('FLAGOS_BPU_CACHE')\n"
    "print('IMPORTED', torch.zeros(2, device='flagos').cpu().sum().item())\n"
)


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_malformed_env_file_warns_once_and_import_torch_works(tmp_path: Path, kind: str):
    content, where = MALFORMED[kind]
    path = tmp_path / "env"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "FLAGOS_BPU_ENV_FILE": str(path),
    }
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "IMPORTED 0.0" in proc.stdout
    warned = [line for line in proc.stderr.splitlines() if str(path) in line]
    assert len(warned) == 1, proc.stderr[-3000:]  # once, not on every lookup
    assert where in warned[0] and "invoke provision --only envfile" in warned[0]
    if kind in ("line_without_equals", "not_utf8"):
        assert "MARCH nash-e" in proc.stdout  # the good lines still count


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_provision_envfile_repairs_any_content(tmp_path: Path, kind: str):
    from provision import config, plan
    from provision.context import Context, Options
    from provision.results import NEEDED, OK, Inputs, X86PythonFound
    from provision.steps.envfile import STEP
    from provision.target import LocalTarget

    path = tmp_path / "env"
    content, _ = MALFORMED[kind]
    if content is None:
        path.mkdir()
        (path / "keep").write_text("user data")
    else:
        path.write_bytes(content)
    facts = {"arch": "x86_64", "board_model": "", "env_file": str(path)}
    ctx = Context(
        LocalTarget(), facts, config.load(), Options(), tmp_path, tmp_path, echo=lambda m: None
    )
    inputs = Inputs(x86_python=X86PythonFound("/opt/x86/python3", "", False))
    res = plan._check(STEP, ctx, inputs)
    assert res.status == NEEDED
    STEP.apply(ctx, res, inputs)
    assert envfile.load_env_file(path)["FLAGOS_BPU_X86_PYTHON"] == "/opt/x86/python3"
    assert plan._check(STEP, ctx, inputs).status == OK
    if content is None:  # the directory was moved aside, not deleted
        (aside,) = tmp_path.glob("env.replaced-*")
        assert (aside / "keep").read_text() == "user data"


def test_byte_order_mark_does_not_hide_the_first_line(tmp_path: Path):
    """Editors on Windows save UTF-8 with a BOM; the first setting must still count."""
    path = tmp_path / "env"
    path.write_bytes(b"\xef\xbb\xbfFLAGOS_BPU_ACT_SCALE=0.1\r\nFLAGOS_BPU_MARCH=nash-m\r\n")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert envfile.read_env_file(path) == {
            "FLAGOS_BPU_ACT_SCALE": ("0.1", 1),
            "FLAGOS_BPU_MARCH": ("nash-m", 2),
        }


@pytest.mark.parametrize("kind", ["fifo", "char_device"])
def test_env_file_that_is_not_a_regular_file_does_not_block_import(tmp_path: Path, kind: str):
    """Reading a FIFO or /dev/zero would block (or grow memory) in every `import torch`."""
    path = tmp_path / "env"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "FLAGOS_BPU_ENV_FILE": str(path)}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "IMPORTED 0.0" in proc.stdout
    warned = [line for line in proc.stderr.splitlines() if str(path) in line]
    assert len(warned) == 1 and "not a regular file" in warned[0], proc.stderr[-3000:]

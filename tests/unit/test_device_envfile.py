"""The per-user env file that provisioning writes (torch_fl/envfile.py)."""

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


def test_default_location_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.delenv("FLAGOS_BPU_ENV_FILE", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert envfile.env_file_path() == tmp_path / "torch-fl" / "env"
    assert envfile.load_env_file() == {}

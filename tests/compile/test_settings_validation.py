"""Hostile option values: each is refused with one error naming the option, where the value came
from (option, environment variable, or env file with path and line) and the valid values."""

import math
import os

import pytest
import torch

from tests.compile.bpu_helpers import compile_bpu
from torch_fl.bpu import settings
from torch_fl.bpu.errors import BpuError

BAD_OPTIONS = [
    ("act_scale", math.inf),
    ("act_scale", 1e300),
    ("act_scale", 1e-300),
    ("act_scale", True),
    ("act_scale", math.nan),
    ("act_scale", "0.1abc"),
    ("sim_threads", math.inf),
    ("sim_threads", 99999),
    ("sim_threads", 2.5),
    ("sim_threads", True),
    ("min_partition_ops", math.inf),
    ("min_partition_ops", -1),
    ("compile_timeout", math.inf),
    ("compile_timeout", math.nan),
    ("calib_percentile", math.nan),
    ("calib_percentile", True),
    ("opt_level", 99),
    ("cache_dir", None),
    ("cache_dir", 123),
    ("cache_dir", ""),
    ("quantize", "maybe"),
    ("executor", None),
    ("calibration", 5),
]


@pytest.mark.parametrize(("name", "value"), BAD_OPTIONS, ids=[f"{n}={v!r}" for n, v in BAD_OPTIONS])
def test_bad_option_refused_with_name_source_and_valid_values(name, value, tmp_path):
    os.chdir(tmp_path)  # a value mistaken for a path would create ./None, ./123 here
    with pytest.raises(settings.SettingsError) as err:
        settings.resolve({name: value})
    text = str(err.value)
    assert f"{name}" in text and "(from options)" in text and "valid:" in text
    assert isinstance(err.value, BpuError) and isinstance(err.value, ValueError)
    assert list(tmp_path.iterdir()) == []
    assert len(text.splitlines()) == 1  # one line, not the table of every option


def test_options_must_be_a_dict():
    with pytest.raises(settings.SettingsError, match="options must be a dict.*got str"):
        settings.resolve("executor=sim")
    with pytest.raises(Exception, match="options must be a dict"):  # wrapped by Dynamo
        with torch.no_grad():
            compile_bpu(torch.nn.Linear(2, 2).eval(), **{})  # sanity: empty is fine
            torch.compile(torch.nn.Linear(2, 2), backend="bpu", options=["sim"])(torch.ones(1, 2))


def test_calibration_path_that_is_a_directory(tmp_path):
    with pytest.raises(settings.SettingsError, match=r"calibration.*is a directory"):
        settings.resolve({"calibration": str(tmp_path)})
    bad = tmp_path / "cal.json"
    bad.write_bytes(b"\xff\xfe not json")
    with pytest.raises(settings.SettingsError, match=r"calibration.*cal.json"):
        settings.resolve({"calibration": bad})


def test_env_var_named_as_source(monkeypatch):
    monkeypatch.setenv("FLAGOS_BPU_SIM_THREADS", "99999")
    with pytest.raises(settings.SettingsError) as err:
        settings.resolve()
    text = str(err.value)
    assert "sim_threads" in text and "$FLAGOS_BPU_SIM_THREADS" in text
    assert f"[0, {settings.max_sim_threads()}]" in text


def test_env_file_named_with_path_and_line(tmp_path, monkeypatch):
    env_file = tmp_path / "env"
    env_file.write_text("# provisioning\nFLAGOS_BPU_MARCH=nash-e\nFLAGOS_BPU_ACT_SCALE=inf\n")
    monkeypatch.setenv("FLAGOS_BPU_ENV_FILE", str(env_file))
    monkeypatch.delenv("FLAGOS_BPU_ACT_SCALE", raising=False)
    with pytest.raises(settings.SettingsError) as err:
        settings.resolve()
    text = str(err.value)
    assert f"{env_file}:3" in text and "$FLAGOS_BPU_ACT_SCALE" not in text
    assert "act_scale" in text


def test_sane_values_accepted():
    s = settings.resolve(
        {
            "act_scale": 0.02,
            "sim_threads": settings.max_sim_threads(),
            "min_partition_ops": 3,
            "cache_dir": "~/x",
            "compile_timeout": 60,
            "opt_level": 0,
        }
    )
    assert s.sim_threads == settings.max_sim_threads() and s.cache_dir.endswith("/x")
    assert os.path.isabs(s.cache_dir)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"method": "median"}, "calib_method"), ({"percentile": math.nan}, "calib_percentile")],
)
def test_calibrate_arguments_checked_like_options(kwargs, name):
    import torch_fl.bpu as bpu

    with pytest.raises(settings.SettingsError, match=f"{name} \\(from calibrate\\("):
        bpu.calibrate(torch.nn.Linear(2, 2), [torch.ones(1, 2)], **kwargs)

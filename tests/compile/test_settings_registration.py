import pytest
import torch

import torch_fl.bpu as bpu
from tests.compile.bpu_helpers import compile_bpu
from torch_fl.bpu import backend, settings


def test_backend_registered_and_registration_idempotent():
    assert "bpu" in torch._dynamo.list_backends()
    backend.register()  # a second registration must not raise a duplicate-name error
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("bpu") is bpu.bpu_backend


def test_defaults_in_one_place():
    s = settings.resolve()
    assert (s.executor, s.act_scale, s.march, s.quantize) == ("auto", 0.05, "nash-e", True)


def test_unknown_option_lists_valid_ones():
    with pytest.raises(settings.SettingsError) as err:
        settings.resolve({"exector": "sim"})
    assert "exector" in str(err.value) and "executor:" in str(err.value)


def test_bad_value_names_option_and_choices():
    with pytest.raises(settings.SettingsError) as err:
        settings.resolve({"march": "bayes-e"})
    assert "march" in str(err.value) and "nash-e|nash-m|nash-p" in str(err.value)
    with pytest.raises(settings.SettingsError):
        settings.resolve({"act_scale": -1})


def test_env_overrides_default_and_option_overrides_env(monkeypatch):
    monkeypatch.setenv("FLAGOS_BPU_ACT_SCALE", "0.125")
    assert settings.resolve().act_scale == 0.125
    assert settings.resolve({"act_scale": 0.5}).act_scale == 0.5
    monkeypatch.setenv("FLAGOS_BPU_STRICT", "maybe")
    with pytest.raises(settings.SettingsError, match="FLAGOS_BPU_STRICT"):
        settings.resolve()


def test_env_file_read_at_call_time(tmp_path, monkeypatch):
    env_file = tmp_path / "env"
    monkeypatch.setenv("FLAGOS_BPU_ENV_FILE", str(env_file))
    assert settings.resolve().march == "nash-e"
    env_file.write_text("# written by provisioning\nFLAGOS_BPU_MARCH=nash-p\n")
    assert settings.resolve().march == "nash-p"


def test_torch_compile_rejects_unknown_option():
    model = torch.nn.Linear(4, 4).eval()
    with pytest.raises(Exception, match="unknown option"):
        with torch.no_grad():
            compile_bpu(model, not_an_option=1)(torch.randn(2, 4))

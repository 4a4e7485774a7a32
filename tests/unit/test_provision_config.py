"""Configuration validation, host parsing and step selection: bad input -> clear errors."""

from __future__ import annotations

import pytest

from provision import config as c
from provision import plan
from provision.target import parse_host


def test_defaults_are_valid_and_pinned():
    cfg = c.load()
    assert cfg.policy.min_box64 == "0.4.0"
    for pin in (cfg.box64.source, cfg.x86_python.tarball):
        assert len(pin.sha256) == 64 and pin.url.startswith("https://")


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ({"policy": {"min_box64": "new"}}, "policy.min_box64"),
        ({"box64": {"source": {"sha256": "TO-FILL"}}}, "box64.source.sha256"),
        ({"x86_python": {"tarball": {"url": "http://example.com/p.tgz"}}}, "https://"),
        ({"x86_python": {"source": "conda"}}, "x86_python.source"),
        ({"march": "nash-z"}, "march"),
        ({"steps": {"skip": ["box65"]}}, "steps.skip"),
        ({"box64": {"source": {"mb_per_job": 10}}}, "mb_per_job"),
        ({"build_verify": {"timeout_s": -1}}, "build_verify.timeout_s"),
        ({"torch_env": {"torch": {"source": "pip"}}}, "torch_env.torch.source"),
        ({"torch_env": {"torch": {"version": "latest"}}}, "torch_env.torch.version"),
        ({"torch_env": {"torch": {"supported": "2.10"}}}, "torch_env.torch.supported"),
        ({"torch_env": {"torch": {"index_url": "http://x/simple"}}}, "torch_env.torch.index_url"),
        ({"torch_env": {"wheels": ["numpy"]}}, "torch_env.wheels"),
        ({"torch_fl": {"build_timeout_s": 0}}, "torch_fl.build_timeout_s"),
    ],
)
def test_bad_values_name_key_and_fix(override, needle):
    with pytest.raises(c.ConfigError, match=needle.replace(".", r"\.")):
        c.parse(c.deep_merge(c.defaults(), override))


def test_to_fill_sha_explains_how(tmp_path):
    f = tmp_path / "o.yaml"
    f.write_text("x86_python:\n  tarball:\n    sha256: ''\n")
    with pytest.raises(c.ConfigError, match="sha256sum cpython-3.11"):
        c.load(str(f))


def test_config_file_errors(tmp_path):
    with pytest.raises(c.ConfigError, match="does not exist"):
        c.load(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy: [unclosed\n")
    with pytest.raises(c.ConfigError, match="not valid YAML") as info:
        c.load(str(bad))
    assert "\n" not in str(info.value)  # one line, like every other input error


def test_parse_host():
    h = parse_host("root@192.168.1.10:2222")
    assert (h.user, h.host, h.port) == ("root", "192.168.1.10", 2222)
    assert parse_host("board").port == 22 and parse_host("board").user is None
    assert parse_host("u@[::1]:22").host == "::1"
    for bad in ("u@@h", "u@h:0", "u@h:70000", "u@h:abc", ""):
        with pytest.raises(ValueError, match="user@addr|port"):
            parse_host(bad)


def test_step_selection():
    assert plan.select(None, None, []) == list(c.STEP_NAMES)
    assert plan.select("envfile,box64", None, []) == ["box64", "envfile"]
    assert "build_verify" not in plan.select(None, "build-verify", [])
    assert "build_verify" not in plan.select(None, None, ["build_verify"])
    assert plan.select("build_verify", None, ["build_verify"]) == ["build_verify"]
    with pytest.raises(ValueError, match="unknown step"):
        plan.select("box65", None, [])


# -- the march written to the env file must be one the compile backend accepts ---------------


def _envfile_check(tmp_path, board_model: str, march: str = "auto"):
    from provision.context import Context, Options
    from provision.results import Inputs
    from provision.steps.envfile import STEP as ENVFILE
    from provision.target import LocalTarget

    facts = {"arch": "x86_64", "board_model": board_model, "env_file": str(tmp_path / "env")}
    cfg = c.parse(c.deep_merge(c.defaults(), {"march": march}))
    ctx = Context(LocalTarget(), facts, cfg, Options(), tmp_path, tmp_path, echo=lambda m: None)
    return plan._check(ENVFILE, ctx, Inputs()), ctx, ENVFILE


@pytest.mark.parametrize("march", ["bayes-e", "bernoulli2"])
def test_config_rejects_marches_the_backend_rejects(march):
    with pytest.raises(c.ConfigError, match="march"):
        c.parse(c.deep_merge(c.defaults(), {"march": march}))


@pytest.mark.parametrize("model", ["RDK X5", "RDK X3"])
def test_unsupported_board_bpu_fails_instead_of_writing_env_file(tmp_path, model):
    res, _, _ = _envfile_check(tmp_path, model)
    assert res.status == "failed" and "does not target" in res.detail, res.detail
    assert not (tmp_path / "env").exists()


@pytest.mark.parametrize("model", ["RDK S100", "RDK S100P", "RDK S600", ""])
def test_provisioned_env_file_is_accepted_by_the_backend(tmp_path, monkeypatch, model):
    from torch_fl.bpu import settings

    res, ctx, step = _envfile_check(tmp_path, model)
    assert res.status == "needed", res.detail
    step.apply(ctx, res, None)
    for key in settings.ENV_VARS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("FLAGOS_BPU_ENV_FILE", str(tmp_path / "env"))
    resolved = settings.resolve()  # raised SettingsError for a march it does not compile for
    assert resolved.march == res.facts["values"]["FLAGOS_BPU_MARCH"]


def test_provisioning_and_backend_share_one_march_list():
    from torch_fl.bpu import settings

    assert set(c.MARCHES) == set(settings.MARCHES)
    for march in c.MARCHES:
        c.parse(c.deep_merge(c.defaults(), {"march": march}))
        assert settings.resolve({"march": march}).march == march


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("prefix: 5\n", "prefix"),
        ("cache_dir: [1]\n", "cache_dir"),
        ("ssh: {known_hosts: 5}\n", "ssh.known_hosts"),
        ("ssh: {identity: [a]}\n", "ssh.identity"),
        ("ssh: {connect_timeout_s: .nan}\n", "ssh.connect_timeout_s"),
        ("ssh: {connect_timeout_s: .inf}\n", "ssh.connect_timeout_s"),
        ("ssh: {connect_timeout_s: true}\n", "ssh.connect_timeout_s"),
        ("box64: {path: 7}\n", "box64.path"),
        ("box64: {allow_distro: maybe}\n", "box64.allow_distro"),
        ("x86_python: {distro: {candidates: 5}}\n", "x86_python.distro.candidates"),
        ("x86_python: {distro: {candidates: [1]}}\n", "x86_python.distro.candidates"),
        ("build_verify: {build_command: 5}\n", "build_verify.build_command"),
        ("policy: 5\n", "policy"),
    ],
)
def test_config_values_of_the_wrong_type_name_the_key(tmp_path, text, key):
    f = tmp_path / "o.yaml"
    f.write_text(text)
    with pytest.raises(c.ConfigError, match=f"{key.replace('.', r'[.]')} = "):
        c.load(str(f))


def test_empty_config_path_is_an_error_not_the_defaults():
    with pytest.raises(c.ConfigError, match="--config ''"):
        c.load("")


@pytest.mark.parametrize("bad", ["[:]", "u@[zz]", "[1.2.3.4]", "::1", "fe80::1:22"])
def test_parse_host_refuses_what_is_not_an_address(bad):
    with pytest.raises(ValueError, match="user@addr|IPv6"):
        parse_host(bad)


def test_a_fifo_as_config_file_is_refused_unread(tmp_path) -> None:
    import os

    from provision.config import ConfigError, read_yaml_mapping

    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        read_yaml_mapping(fifo)  # a read would block forever: no writer

"""provision.yaml and the typed fields of provision/settings.py cannot drift apart."""

from __future__ import annotations

import dataclasses

import pytest

from provision import config, settings


def _yaml_keys(node: dict, prefix: str = "") -> dict[str, bool]:
    """Every dotted key of provision.yaml -> whether it holds a mapping (a section)."""
    out: dict[str, bool] = {}
    for key, value in node.items():
        dotted = f"{prefix}{key}"
        out[dotted] = isinstance(value, dict)
        if isinstance(value, dict):
            out.update(_yaml_keys(value, f"{dotted}."))
    return out


def _field_keys() -> dict[str, bool]:
    return {
        key: settings.is_section(settings.types_of(owner)[item.name])
        for key, (owner, item) in _owned_fields().items()
    }


def _owned_fields(cls: type = settings.Settings, prefix: str = "") -> dict:
    out = {}
    for item in dataclasses.fields(cls):
        kind = settings.types_of(cls)[item.name]
        out[f"{prefix}{item.name}"] = (cls, item)
        if settings.is_section(kind):
            out.update(_owned_fields(kind, f"{prefix}{item.name}."))
    return out


def test_every_yaml_key_has_a_field_and_every_field_a_key():
    in_yaml, declared = _yaml_keys(config.defaults()), _field_keys()
    assert sorted(set(in_yaml) - set(declared)) == [], "keys of provision.yaml without a field"
    assert sorted(set(declared) - set(in_yaml)) == [], "fields without a key in provision.yaml"
    assert in_yaml == declared, "a section in one is a value in the other"
    assert set(settings.all_fields()) == set(declared)


@pytest.mark.parametrize("key", sorted(_field_keys()))
def test_every_field_has_a_one_line_doc(key):
    _, item = _owned_fields()[key]
    doc = item.metadata.get("doc")
    assert isinstance(doc, str) and doc.strip() and "\n" not in doc, key


def test_the_defaults_parse_into_frozen_typed_settings():
    cfg = config.load()
    assert isinstance(cfg, settings.Settings)
    assert isinstance(cfg.box64.source, settings.Pin) and isinstance(
        cfg.x86_python.tarball, settings.Pin
    )
    assert isinstance(cfg.torch_env.wheels, tuple) and cfg.ssh.connect_timeout_s == 20.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.prefix = "elsewhere"  # type: ignore[misc]


def test_a_key_missing_from_the_defaults_names_the_key_and_the_file():
    raw = config.defaults()
    del raw["ssh"]["identity"]
    with pytest.raises(config.ConfigError, match=r"ssh\.identity is missing; restore it from"):
        config.parse(raw)


def test_a_key_without_a_field_is_refused_with_a_guess():
    raw = config.deep_merge(config.defaults(), {"ssh": {"identiti": ""}})
    with pytest.raises(
        config.ConfigError, match=r"unknown key 'ssh\.identiti'; did you mean ssh\.identity\?"
    ):
        config.parse(raw)

"""Provisioning through Fabric against a real OpenSSH server on 127.0.0.1, like a board."""

from __future__ import annotations

import json
from pathlib import Path

from provision import report


def test_remote_apply_then_zero_actions(sshd, iso, fast_config, provision_cli):
    run_provision = provision_cli
    root, env = iso
    sshd.client_home(Path(env["HOME"]))
    rep = root / "remote.json"
    first = run_provision(
        env, "--host", sshd.host, "--config", str(fast_config), "--report", str(rep)
    )
    assert first.returncode == 0, first.stdout + first.stderr
    doc = json.loads(rep.read_text())
    report.validate(doc)
    assert doc["local"] is False and doc["target"].endswith(f":{sshd.port}")
    assert doc["actions"] >= 2
    env_file = sshd.remote / "config" / "torch-fl" / "env"
    text = env_file.read_text()
    assert "FLAGOS_BPU_X86_PYTHON=" + str(sshd.remote / "data") in text
    # nothing landed in the client's own XDG dirs: the work happened on the "board"
    assert not (root / "config" / "torch-fl" / "env").exists()

    second = run_provision(
        env, "--host", sshd.host, "--config", str(fast_config), "--report", str(rep)
    )
    assert second.returncode == 0, second.stdout + second.stderr
    doc2 = json.loads(rep.read_text())
    assert doc2["actions"] == 0
    assert all(s["action"] == "none" for s in doc2["steps"])


def test_unknown_host_key_is_rejected(sshd, iso, fast_config, provision_cli):
    run_provision = provision_cli
    root, env = iso
    sshd.client_home(Path(env["HOME"]), trust=False)
    res = run_provision(
        env,
        "--host",
        sshd.host,
        "--config",
        str(fast_config),
        "--dry",
        "--report",
        str(root / "r.json"),
    )
    assert res.returncode == 1
    assert "known_hosts" in res.stderr
    assert not (sshd.remote / "config").exists()


def test_insecure_flag_relaxes_host_key_check(sshd, iso, fast_config, provision_cli):
    run_provision = provision_cli
    root, env = iso
    sshd.client_home(Path(env["HOME"]), trust=False)
    rep = root / "r.json"
    res = run_provision(
        env,
        "--host",
        sshd.host,
        "--insecure-host-key",
        "--dry",
        "--config",
        str(fast_config),
        "--report",
        str(rep),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads((root / "r.dry.json").read_text())["dry"] is True
    assert not (sshd.remote / "data").exists(), "--dry must not change the target"

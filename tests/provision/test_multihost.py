"""`invoke provision --host a,b` against real OpenSSH servers on loopback, one per "board"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provision import report
from provision.multihost import split_hosts
from tests.support.sshd import SshServer, free_port


@pytest.fixture
def two_sshd(tmp_path: Path):
    servers = [SshServer(tmp_path / "sshd-a"), SshServer(tmp_path / "sshd-b")]
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


def _trust(home: Path, servers: list[SshServer], trusted: list[SshServer]) -> None:
    """~/.ssh with every server's user key and only the `trusted` servers' host keys."""
    ssh = home / ".ssh"
    ssh.mkdir(parents=True, exist_ok=True)
    for i, server in enumerate(servers):
        key = ssh / f"id_{i}"
        key.write_bytes(server.user_key.read_bytes())
        key.chmod(0o600)
    lines = [f"[127.0.0.1]:{s.port} {' '.join(s.host_pub.split()[:2])}\n" for s in trusted]
    (ssh / "known_hosts").write_text("".join(lines))


def _config(tmp_path: Path, identity: Path) -> Path:
    path = tmp_path / "multi.yaml"
    path.write_text(
        f"steps:\n  skip: [torch_env, torch_fl, build_verify]\nssh:\n  identity: {identity}\n",
        encoding="utf-8",
    )
    return path


def _overlap(a: dict, b: dict) -> bool:
    return a["started"] < b["finished"] and b["started"] < a["finished"]


def test_two_hosts_in_parallel_then_zero_actions(two_sshd, iso, provision_cli):
    root, env = iso
    a, b = two_sshd
    # Both servers accept the same user key, so one identity reaches both.
    b_auth = b.root / "keys" / "authorized_keys"
    b_auth.write_text((a.user_key.with_suffix(".pub")).read_text())
    _trust(Path(env["HOME"]), two_sshd, two_sshd)
    cfg = _config(root, a.user_key)
    combined = root / "out" / "all.json"
    res = provision_cli(
        env, "--host", f"{a.host},{b.host}", "--config", str(cfg), "--report", str(combined)
    )
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(combined.read_text())
    assert doc["schema"] == "torch-fl/provision-multi/1" and doc["exit_code"] == 0
    hosts = doc["hosts"]
    assert [h["name"] for h in hosts] == [a.host, b.host]
    assert all(h["status"] == "ok" and h["actions"] >= 2 for h in hosts), hosts
    assert _overlap(hosts[0], hosts[1]), f"hosts ran one after the other: {hosts}"
    for h, server in zip(hosts, two_sshd, strict=True):
        per_host = json.loads(Path(h["report"]).read_text())
        report.validate(per_host)
        assert per_host["target"] == h["name"]
        assert (server.remote / "config" / "torch-fl" / "env").is_file()
    # one table row per host and step
    for server in two_sshd:
        rows = [ln for ln in res.stdout.splitlines() if ln.startswith(server.host + " ")]
        assert {ln.split()[1] for ln in rows} >= {"prereqs", "x86_python", "envfile"}, rows

    again = provision_cli(
        env, "--host", a.host, "--host", b.host, "--config", str(cfg), "--report", str(combined)
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert [h["actions"] for h in json.loads(combined.read_text())["hosts"]] == [0, 0]


def test_unreachable_and_untrusted_hosts_do_not_stop_the_others(two_sshd, iso, provision_cli):
    root, env = iso
    a, b = two_sshd
    _trust(Path(env["HOME"]), two_sshd, [a])  # b's host key is unknown: must be rejected
    cfg = _config(root, a.user_key)
    closed = f"{a.user}@127.0.0.1:{free_port()}"
    combined = root / "out" / "all.json"
    res = provision_cli(
        env,
        "--host", f"{a.host},{closed}", "--host", b.host,
        "--config", str(cfg), "--report", str(combined),
    )  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    hosts = {h["name"]: h for h in json.loads(combined.read_text())["hosts"]}
    assert hosts[a.host]["status"] == "ok"
    assert hosts[closed]["status"] == "unreachable"
    assert hosts[b.host]["status"] == "unreachable"
    assert "known_hosts" in hosts[b.host]["error"]
    assert (a.remote / "config" / "torch-fl" / "env").is_file()
    assert not (b.remote / "config").exists(), "an untrusted host must receive nothing"
    unreachable = json.loads(Path(hosts[closed]["report"]).read_text())
    report.validate(unreachable)
    assert unreachable["exit_code"] == 1 and unreachable["error"]
    assert f"{closed}" in res.stdout and "unreachable" in res.stdout


@pytest.mark.parametrize(
    ("hosts", "message"),
    [
        ("root@10.0.0.1,,root@10.0.0.2", "empty entry"),
        ("root@10.0.0.1,root@10.0.0.1:22", "given twice"),
        ("root@10.0.0.1,root@bad host", "not user@addr"),
    ],
)
def test_bad_host_lists_are_bad_input(hosts, message, iso, provision_cli):
    root, env = iso
    res = provision_cli(env, "--host", hosts, "--dry", "--report", str(root / "r.json"))
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr
    assert not (root / "r.json").exists()


def test_split_hosts_keeps_order_and_accepts_repeats():
    specs = split_hosts(["root@a,root@b:2222", "c"])
    assert [(s.user, s.host, s.port) for s in specs] == [
        ("root", "a", 22),
        ("root", "b", 2222),
        (None, "c", 22),
    ]
    assert split_hosts(None) == [] and split_hosts([]) == []


def test_dry_run_of_several_hosts_changes_nothing(two_sshd, iso, provision_cli):
    root, env = iso
    a, b = two_sshd
    b_auth = b.root / "keys" / "authorized_keys"
    b_auth.write_text((a.user_key.with_suffix(".pub")).read_text())
    _trust(Path(env["HOME"]), two_sshd, two_sshd)
    cfg = _config(root, a.user_key)
    combined = root / "out" / "all.json"
    res = provision_cli(
        env, "--host", f"{a.host},{b.host}", "--dry", "--config", str(cfg),
        "--report", str(combined),
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert not combined.exists(), "a dry run must not overwrite the real report"
    doc = json.loads(combined.with_name("all.dry.json").read_text())
    assert doc["dry"] is True and [h["status"] for h in doc["hosts"]] == ["ok", "ok"]
    for host in doc["hosts"]:
        assert host["report"].endswith(".dry.json")
        assert json.loads(Path(host["report"]).read_text())["dry"] is True
    for server in two_sshd:
        assert not (server.remote / "config").exists(), "--dry must not change a host"


def test_table_wraps_long_details_instead_of_cutting_them():
    from provision.multihost import HostResult, table

    error = "cannot connect to nobody@127.0.0.1:1: " + " ".join(f"word{i}" for i in range(40))
    res = HostResult("nobody@127.0.0.1:1", "unreachable", 1, "r.json", 0.0, 0.1, error=error)
    text = table([res])
    words = " ".join(line.strip() for line in text.splitlines()[2:]).split()
    assert words[-40:] == [f"word{i}" for i in range(40)]  # every word, none cut
    assert max(len(line) for line in text.splitlines()) <= 140


def test_hosts_whose_report_names_would_collide_are_refused():
    # `u@[::1]:2` and `u@1:2` are different hosts; both reports would be u_1_2.json
    with pytest.raises(ValueError, match="same report file"):
        split_hosts(["u@[::1]:2,u@1:2"])

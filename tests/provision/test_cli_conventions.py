"""`invoke provision` as a hostile user meets it: flags, bad files, interrupts, dry runs.

Every case runs invoke's real CLI in a separate process with HOME and the XDG dirs under a temp
dir; the SSH cases use a real OpenSSH server on loopback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, run_provision


def _one_clear_line(proc: subprocess.CompletedProcess, needle: str) -> None:
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert "Traceback" not in text, text
    assert needle in text, text


def test_short_h_is_help_and_capital_h_is_host(iso) -> None:
    _, env = iso
    proc = run_provision(env, "-h", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "-H, --host" in proc.stdout and "Usage:" in proc.stdout
    # -H takes the host: port 1 on loopback refuses, and the error names that host.
    proc = run_provision(env, "-H", "nobody@127.0.0.1:1", "--only", "envfile", timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "cannot connect to nobody@127.0.0.1:1" in proc.stderr


def _invoke(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "invoke", "--search-root", str(REPO / "provision"), *argv]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_invoke_dry_changes_nothing_and_keeps_the_real_report(iso) -> None:
    root, env = iso
    report = root / "report.json"
    report.write_text('{"real": true}\n')
    proc = _invoke(env, "--dry", "provision", "--only", "x86_python,envfile", "--json", str(report))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(dry run)" in proc.stdout
    assert not (root / "data").exists(), "a dry run created the venv prefix"
    assert not (root / "config" / "torch-fl" / "env").exists(), "a dry run wrote the env file"
    assert report.read_text() == '{"real": true}\n', "a dry run overwrote the real report"
    dry = json.loads((root / "report.dry.json").read_text())
    assert dry["dry"] is True and dry["actions"] == 0
    # The task's own --dry behaves the same.
    proc = run_provision(env, "--dry", "--only", "envfile", "--json", str(report), timeout=120)
    assert proc.returncode == 0 and report.read_text() == '{"real": true}\n'


def test_invoke_echo_shows_the_commands_and_json_dash_is_stdout(iso) -> None:
    _, env = iso
    proc = _invoke(env, "-e", "provision", "--dry", "--only", "envfile", "--json", "-")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[local] $ " in proc.stderr  # people's output on stderr ...
    doc = json.loads(proc.stdout)  # ... so stdout is the report alone
    assert doc["dry"] is True and [s["name"] for s in doc["steps"]] == ["envfile"]
    assert not (REPO / "-.dry.json").exists() and not (REPO / "-").exists()


@pytest.mark.parametrize(
    ("args", "files", "needle"),
    [
        (["--config", "DIR"], {}, "is a directory; give the YAML file"),
        (["--config", "bin.yaml"], {"bin.yaml": b"\x00\xff\xfe\x80junk"}, "bin.yaml is not UTF-8"),
        (
            ["--config", "typo.yaml"],
            {"typo.yaml": b"policy:\n  min_box46: '0.4.0'\n"},
            "unknown key 'policy.min_box46'; did you mean policy.min_box64?",
        ),
        (["--json", "DIR"], {}, "is a directory"),
        (["--json", "afile/report.json"], {"afile": b"x"}, "is a file, not a directory"),
        (["--report", "DIR"], {}, "--report"),
        (["--only", ""], {}, "--only '' names no step"),
        (["--only", "envfile", "--skip", "envfile"], {}, "--only and --skip both name envfile"),
        (["--only", "box65"], {}, "unknown step(s) ['box65']"),
        # An empty value ("$UNSET") is a mistake, not "use the default".
        (["--only", "envfile", "--config", ""], {}, "--config '' is empty"),
        (["--only", "envfile", "--artifacts", ""], {}, "--artifacts '' is empty"),
        (["--only", "envfile", "--oe-wheels", ""], {}, "--oe-wheels '' is empty"),
        (["--only", "envfile", "--json", ""], {}, "--json '' is empty"),
        (["--only", "envfile", "--report", " "], {}, "--report ' ' is empty"),
        (["--only", "envfile", "-H", "[:]"], {}, "is not an IPv6 address"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(iso, args, files, needle) -> None:
    root, env = iso
    (root / "DIR").mkdir()
    for name, data in files.items():
        (root / name).write_bytes(data)
    argv = [
        str(root / a) if a and not a.startswith("-") and ((root / a).exists() or "/" in a) else a
        for a in args
    ]
    proc = run_provision(env, *argv, timeout=120)
    _one_clear_line(proc, needle)


def test_unwritable_config_home_is_refused_before_any_step(iso) -> None:
    root, env = iso
    # A regular file where the config directory should be: nothing can be written below it
    # (a read-only directory behaves the same for a non-root user; root ignores mode bits).
    (root / "config").write_text("not a directory")
    proc = run_provision(env, "--only", "envfile", timeout=120)
    _one_clear_line(proc, "the env file")
    assert "is not a writable directory" in proc.stderr and "FLAGOS_BPU_ENV_FILE" in proc.stderr


def _ssh_config(root: Path, **ssh: str) -> Path:
    path = root / "ssh.yaml"
    path.write_text("ssh:\n" + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in ssh.items()))
    return path


def test_junk_identity_and_known_hosts_name_the_file(iso, sshd) -> None:
    root, env = iso
    sshd.client_home(Path(env["HOME"]))
    junk = root / "junk"
    junk.write_bytes(b"\x00\xffgarbage\xfe\n" * 4)
    cfg = _ssh_config(root, identity=str(junk))
    proc = run_provision(env, "--host", sshd.host, "--config", str(cfg), "--only", "envfile")
    _one_clear_line(proc, f"ssh.identity {junk} is not an OpenSSH/PEM private key")
    cfg = _ssh_config(root, known_hosts=str(junk))
    proc = run_provision(env, "--host", sshd.host, "--config", str(cfg), "--only", "envfile")
    _one_clear_line(proc, f"known_hosts file {junk} cannot be read")


def test_password_only_host_is_one_line(iso, password_only_sshd) -> None:
    _, env = iso
    password_only_sshd.client_home(Path(env["HOME"]))
    proc = run_provision(env, "--host", password_only_sshd.host, "--only", "envfile")
    _one_clear_line(proc, "accepts only password authentication")
    assert "ssh-copy-id" in proc.stderr


FAKE_PYTHON = """#!/bin/sh
# Stand-in interpreter for the interrupt test: `-m venv DIR` hangs like a slow venv + pip,
# with a grandchild, as `python -m venv` has (ensurepip).
echo $$ > "{pids}/python"
sleep 300 &
echo $! > "{pids}/grandchild"
wait
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie no longer runs; it only waits for its parent to collect it.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_stops_children_reports_and_exits_130(iso, sig) -> None:
    root, env = iso
    pids = root / "pids"
    pids.mkdir()
    fake = root / "slow-python"
    fake.write_text(FAKE_PYTHON.format(pids=pids))
    fake.chmod(0o755)
    cfg = root / "slow.yaml"
    cfg.write_text(f"x86_python:\n  native_python: {json.dumps(str(fake))}\n")
    report = root / "report.json"
    cmd = [sys.executable, "-m", "invoke", "--search-root", str(REPO / "provision"), "provision"]
    cmd += ["--config", str(cfg), "--only", "x86_python,envfile", "--json", str(report)]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not (pids / "grandchild").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (pids / "grandchild").exists(), proc.communicate(timeout=5)
    time.sleep(0.3)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    for name in ("python", "grandchild"):
        pid = int((pids / name).read_text())
        assert not _alive(pid), f"the step's {name} (pid {pid}) outlived the interrupt"
    assert "interrupted during step x86_python" in err and "Re-run the same command" in err
    assert "Traceback" not in out + err
    assert "x86_python" in out and "interrupted" in out  # the partial table
    doc = json.loads(report.read_text())
    assert doc["interrupted"] is True and doc["exit_code"] == 130
    steps = {s["name"]: s for s in doc["steps"]}
    assert steps["x86_python"]["action"] == "interrupted"
    assert steps["envfile"]["action"] == "not run"


def test_long_details_wrap_instead_of_being_cut() -> None:
    from provision.plan import Outcome
    from provision.report import table
    from provision.results import CheckResult

    detail = "word " * 40 + "the-last-word-of-a-long-detail"
    text = table([Outcome("box64", "box64", CheckResult("failed", {}, detail), "none")], width=100)
    lines = text.splitlines()
    assert all(len(line) <= 100 for line in lines), text
    assert "the-last-word-of-a-long-detail" in text
    flowed = " ".join(line.strip() for line in lines[2:]).split("0.0s", 1)[1]
    assert " ".join(flowed.split()) == " ".join(detail.split())


@pytest.mark.parametrize("section", ["provision: [1]", "provision: 5"])
def test_an_invoke_yaml_section_that_is_not_a_mapping_is_bad_input(iso, section) -> None:
    root, env = iso
    Path(env["HOME"], ".invoke.yaml").write_text(section + "\n")
    proc = run_provision(env, "--dry", "--only", "envfile", timeout=120)
    _one_clear_line(proc, "the provision section must be a mapping")


@pytest.mark.parametrize("hosts", ["root@127.0.0.1:1", "root@127.0.0.1:1,root@127.0.0.1:2"])
@pytest.mark.parametrize(
    ("key", "kind", "needle"),
    [
        ("known_hosts", "dir", "known_hosts file"),
        ("identity", "junk", "is not an OpenSSH/PEM private key"),
        ("known_hosts", "junk", "known_hosts file"),
    ],
)
def test_bad_ssh_files_are_bad_input_for_one_or_several_hosts(
    iso, hosts, key, kind, needle
) -> None:
    root, env = iso
    junk = root / "junk"
    junk.write_bytes(b"\xfb\x00\xff not a key or known_hosts line")
    path = root if kind == "dir" else junk
    cfg = _ssh_config(root, **{key: str(path)})
    report = root / "out" / "r.json"
    proc = run_provision(env, "-H", hosts, "--dry", "--config", str(cfg), "--json", str(report),
                         timeout=120)  # fmt: skip
    _one_clear_line(proc, needle)

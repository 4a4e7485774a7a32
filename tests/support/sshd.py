"""A real OpenSSH server on loopback (a board stand-in) and HOME/XDG isolation.

The provision and farm lanes (their conftest fixtures) and scripts/bench_farm_provision.py use
these; sshd missing skips the test that asked for a server.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.process import ROOT

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def isolated_env(root: Path) -> dict[str, str]:
    """Environment whose HOME and XDG dirs live under `root` (nothing touches the real home)."""
    env = dict(os.environ)
    for var in ("FLAGOS_BPU_ENV_FILE", "PYTHONPATH"):
        env.pop(var, None)
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    env.update(
        HOME=str(home),
        XDG_DATA_HOME=str(root / "data"),
        XDG_CONFIG_HOME=str(root / "config"),
        XDG_CACHE_HOME=str(root / "cache"),
        PYTHONPATH=str(ROOT),
    )
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "torch-fl-test", "-f", str(path)],
        check=True,
    )
    return path.with_suffix(".pub").read_text().strip()


class SshServer:
    """sshd on 127.0.0.1 with its own host key and one user key; `stop()` ends it."""

    def __init__(self, root: Path, first_config: str = "") -> None:
        # sshd keeps the first value of a directive: `first_config` overrides the defaults below.
        if not os.path.exists(SSHD):
            pytest.skip("OpenSSH server not installed (apt-get install openssh-server)")
        self.root = root
        self.port = free_port()
        self.user = (
            os.environ.get("USER") or subprocess.check_output(["id", "-un"], text=True).strip()
        )
        keys = root / "keys"
        keys.mkdir(parents=True)
        self.host_pub = _keygen(keys / "host_ed25519")
        self.user_key = keys / "user_ed25519"
        user_pub = _keygen(self.user_key)
        auth = keys / "authorized_keys"
        auth.write_text(user_pub + "\n")
        auth.chmod(0o600)
        # The remote side gets its own XDG dirs, so provisioning over SSH never touches $HOME.
        self.remote = root / "remote"
        env_line = " ".join(
            f"{k}={self.remote / v}"
            for k, v in (
                ("XDG_DATA_HOME", "data"),
                ("XDG_CONFIG_HOME", "config"),
                ("XDG_CACHE_HOME", "cache"),
            )
        )
        cfg = root / "sshd_config"
        cfg.write_text(
            first_config
            + f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {keys / 'host_ed25519'}\n"
            f"AuthorizedKeysFile {auth}\nPidFile {root / 'sshd.pid'}\nStrictModes no\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
            "PermitRootLogin prohibit-password\nSubsystem sftp internal-sftp\nLogLevel ERROR\n"
            f"SetEnv {env_line}\n"
        )
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", exist_ok=True)  # privilege-separation dir sshd insists on
        self.log = open(root / "sshd.log", "w")
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(cfg)], stdout=self.log, stderr=self.log
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(root / 'sshd.log').read_text()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError("sshd did not start listening")

    @property
    def host(self) -> str:
        return f"{self.user}@127.0.0.1:{self.port}"

    def client_home(self, home: Path, trust: bool = True) -> None:
        """Set up ~/.ssh like a developer's: the key, and the host key in known_hosts."""
        ssh = home / ".ssh"
        ssh.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.user_key, ssh / "id_ed25519")
        (ssh / "id_ed25519").chmod(0o600)
        known = f"[127.0.0.1]:{self.port} {' '.join(self.host_pub.split()[:2])}\n" if trust else ""
        (ssh / "known_hosts").write_text(known)

    def stop(self) -> None:
        # Stopped by the PID we started, nothing broader.
        if self.proc.poll() is None:
            os.kill(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, 9)
                self.proc.wait()
        self.log.close()

"""Where provisioning commands run: this machine or a board over SSH, behind one small protocol.

Every step talks to a `Target` only through `run`, `put` and `get`, so the same step code
provisions the local host and a remote board; nothing may assume it runs locally.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TextIO

from provision.floor.exitcodes import TIMED_OUT
from provision.floor.procgroup import kill_group

RunResult = tuple[int, str, str]


class TargetError(RuntimeError):
    """The target could not be reached or a transfer failed."""


class TargetInputError(TargetError):
    """What the user gave cannot work (unreadable key file, a host that only takes passwords)."""


class Target(Protocol):
    """A machine to provision. Commands are POSIX `sh` command lines run on the target."""

    name: str
    is_local: bool

    def run(self, cmd: str, timeout: float = 120.0, env: dict[str, str] | None = None) -> RunResult:
        """Run `cmd` with /bin/sh; return (rc, stdout, stderr). rc 124 means it timed out."""
        ...

    def run_logged(
        self,
        cmd: str,
        log_path: Path,
        timeout: float = 3600.0,
        progress: Callable[[str], None] | None = None,
    ) -> int:
        """Run a long command, streaming its output to a local log file and `progress`."""
        ...

    def put(self, local: Path, remote: str) -> None:
        """Copy a local file to `remote` (a path on the target)."""
        ...

    def get(self, remote: str, local: Path) -> None:
        """Copy a file from the target to `local`."""
        ...

    def close(self) -> None: ...


class _LineSink:
    """Writes streamed output to the log and reports progress at most every few seconds."""

    def __init__(self, log: TextIO, progress: Callable[[str], None] | None) -> None:
        self.log = log
        self.progress = progress
        self.lines = 0
        self._last = 0.0
        self._buf = ""
        self._lock = threading.Lock()

    def write(self, data: str) -> int:
        with self._lock:
            self.log.write(data)
            self.log.flush()
            self._buf += data
            *complete, self._buf = self._buf.split("\n")
            self.lines += len(complete)
            now = time.monotonic()
            if self.progress and complete and now - self._last >= 5.0:
                self._last = now
                last = next((ln for ln in reversed(complete) if ln.strip()), "")
                self.progress(f"{self.lines} lines | {last.strip()[:100]}")
        return len(data)

    def flush(self) -> None:
        self.log.flush()


@contextlib.contextmanager
def _command_log(
    log_path: Path, cmd: str, progress: Callable[[str], None] | None
) -> Iterator[tuple[TextIO, _LineSink]]:
    """The long command's log (appended, headed by the command) and the sink its output goes to."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"$ {cmd}\n")
        yield log, _LineSink(log, progress)


class LocalTarget:
    """This machine, through subprocess.

    Every command leads its own process group: a timeout or a Ctrl-C stops the command and all
    it started (`python -m venv`'s pip, a build's compilers), never leaving them to PID 1.
    """

    is_local = True

    def __init__(self, env: dict[str, str] | None = None, echo: bool = False) -> None:
        self.name = "local"
        self._env = dict(env) if env is not None else None
        self.echo = echo

    def _environ(self, extra: dict[str, str] | None) -> dict[str, str]:
        base = dict(self._env if self._env is not None else os.environ)
        base.update(extra or {})
        return base

    def _echo(self, cmd: str) -> None:
        if self.echo:
            print(f"[{self.name}] $ {cmd}", flush=True)

    def _spawn(self, cmd: str, stderr: int, env: dict[str, str] | None) -> subprocess.Popen:
        # A session of its own: an interrupt or timeout kills the command's whole group.
        return subprocess.Popen(
            ["/bin/sh", "-c", cmd],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=self._environ(env),
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def run(self, cmd: str, timeout: float = 120.0, env: dict[str, str] | None = None) -> RunResult:
        self._echo(cmd)
        proc = self._spawn(cmd, subprocess.PIPE, env)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            out, _ = proc.communicate()
            return TIMED_OUT, out or "", f"timed out after {timeout:.0f}s: {cmd}"
        except BaseException:
            kill_group(proc)
            raise
        return proc.returncode, out, err

    def run_logged(
        self,
        cmd: str,
        log_path: Path,
        timeout: float = 3600.0,
        progress: Callable[[str], None] | None = None,
    ) -> int:
        self._echo(cmd)
        with _command_log(log_path, cmd, progress) as (log, sink):
            proc = self._spawn(cmd, subprocess.STDOUT, None)
            deadline = time.monotonic() + timeout
            assert proc.stdout is not None
            try:
                for line in proc.stdout:
                    sink.write(line)
                    if time.monotonic() > deadline:
                        kill_group(proc)
                        log.write(f"\n[provision] killed after {timeout:.0f}s\n")
                        return TIMED_OUT
                return proc.wait()
            except BaseException:
                kill_group(proc)
                log.write("\n[provision] interrupted\n")
                raise

    def put(self, local: Path, remote: str) -> None:
        dest = Path(remote)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, dest)

    def get(self, remote: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(remote, local)

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class HostSpec:
    user: str | None
    host: str
    port: int


_HOST_RE = re.compile(
    r"^(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::(?P<port>\d+))?$"
)


def parse_host(text: str) -> HostSpec:
    """Parse `user@addr[:port]` (IPv6 in brackets); raise ValueError naming the fix."""
    match = _HOST_RE.match(text.strip())
    if not match:
        raise ValueError(
            f"--host {text!r} is not user@addr[:port]; example: --host root@192.168.1.10:22 "
            "(IPv6 in brackets: root@[::1]:22)"
        )
    port = int(match["port"] or 22)
    if not 0 < port < 65536:
        raise ValueError(f"--host {text!r}: port {port} is outside 1..65535")
    host = match["host"]
    labels = host.rstrip(".").split(".")
    if not host.startswith("[") and (len(host) > 253 or max(len(x) for x in labels) > 63):
        # DNS's limits; past them the resolver fails with a UnicodeError deep inside paramiko
        raise ValueError(
            f"--host {text[:60]!r}{'...' if len(text) > 60 else ''}: the address is {len(host)} "
            "characters; a host name has at "
            "most 253, each dot-separated part at most 63"
        )
    if host.startswith("["):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(
                f"--host {text!r}: {host!r} in brackets is not an IPv6 address; "
                "example: --host root@[fe80::2]:22"
            ) from None
    return HostSpec(match["user"], host, port)


def _check_identity(path: str) -> None:
    """An identity file must be a private key paramiko can read; say which file when not."""
    import paramiko

    if not os.path.isfile(path):
        raise TargetInputError(f"ssh.identity {path} is not a file; point it at a private key")
    try:
        paramiko.PKey.from_path(path)
    except paramiko.PasswordRequiredException:
        raise TargetInputError(
            f"ssh.identity {path} is passphrase-protected; load it into ssh-agent (ssh-add) "
            "and leave ssh.identity empty"
        ) from None
    except (paramiko.SSHException, ValueError, UnicodeDecodeError, OSError) as exc:
        raise TargetInputError(
            f"ssh.identity {path} is not an OpenSSH/PEM private key ({type(exc).__name__}); "
            "point it at the key file itself (not the .pub)"
        ) from None


def _load_known_hosts(client: object, path: str) -> None:
    import paramiko

    try:
        client.load_host_keys(path)  # type: ignore[attr-defined]
    except (paramiko.SSHException, ValueError, UnicodeDecodeError, OSError) as exc:
        raise TargetInputError(
            f"known_hosts file {path} cannot be read ({type(exc).__name__}: {exc}); "
            "remove the bad lines (ssh-keygen -R HOST -f FILE) or point ssh.known_hosts "
            "elsewhere"
        ) from None


def check_ssh_files(identity: str | None, known_hosts: str | None) -> None:
    """The configured identity and known_hosts files are usable (TargetInputError if not).

    Run once before several hosts are provisioned in parallel, so a junk file is one input
    error (exit 2) instead of every host reported unreachable.
    """
    import paramiko

    if identity:
        _check_identity(os.path.expanduser(identity))
    for path in [known_hosts, "~/.ssh/known_hosts"]:  # the files SshTarget loads
        if path and os.path.exists(os.path.expanduser(path)):
            _load_known_hosts(paramiko.SSHClient(), os.path.expanduser(path))


class SshTarget:
    """A remote machine through Fabric; host keys are verified unless explicitly relaxed."""

    is_local = False

    def __init__(
        self,
        spec: HostSpec,
        *,
        insecure_host_key: bool = False,
        known_hosts: str | None = None,
        identity: str | None = None,
        connect_timeout: float = 20.0,
        echo: bool = False,
    ) -> None:
        import paramiko
        from fabric import Connection

        self.spec = spec
        self.echo = echo
        self.name = f"{spec.user + '@' if spec.user else ''}{spec.host}:{spec.port}"
        connect_kwargs: dict[str, object] = {}
        if identity:
            _check_identity(os.path.expanduser(identity))
            connect_kwargs["key_filename"] = [os.path.expanduser(identity)]
        self.conn = Connection(
            host=spec.host,
            user=spec.user,
            port=spec.port,
            connect_timeout=connect_timeout,
            connect_kwargs=connect_kwargs,
        )
        client = self.conn.client
        # Fabric's default policy silently trusts unknown hosts; a board provisioned over a
        # spoofed address would receive our files and run our commands, so reject by default.
        if insecure_host_key:
            client.set_missing_host_key_policy(paramiko.WarningPolicy())
        else:
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        for path in [known_hosts, "~/.ssh/known_hosts"]:
            if path and os.path.exists(os.path.expanduser(path)):
                _load_known_hosts(client, os.path.expanduser(path))
        try:
            self.conn.open()
        except paramiko.BadAuthenticationType as exc:
            raise TargetInputError(
                f"{self.name} accepts only {', '.join(exc.allowed_types) or 'other'} "
                "authentication; provisioning logs in with a key: install yours with "
                f"`ssh-copy-id -p {spec.port} {self.name.rsplit(':', 1)[0]}` or set ssh.identity"
            ) from exc
        except paramiko.AuthenticationException as exc:
            raise TargetInputError(
                f"{self.name} refused every key offered ({exc}); install your public key with "
                f"`ssh-copy-id -p {spec.port} {self.name.rsplit(':', 1)[0]}` or set ssh.identity"
            ) from exc
        except paramiko.SSHException as exc:
            hint = ""
            if "not found in known_hosts" in str(exc) or "Server" in str(exc):
                hint = (
                    f"; add the host key first (ssh-keyscan -p {spec.port} {spec.host} >> "
                    "~/.ssh/known_hosts, after checking its fingerprint) or pass "
                    "--insecure-host-key for a throwaway test host"
                )
            raise TargetError(f"cannot connect to {self.name}: {exc}{hint}") from exc
        except (OSError, UnicodeError) as exc:  # UnicodeError: a name the resolver cannot encode
            raise TargetError(f"cannot connect to {self.name}: {exc}") from exc

    def _echo(self, cmd: str) -> None:
        if self.echo:
            print(f"[{self.name}] $ {cmd}", flush=True)

    def _wrap(self, cmd: str, env: dict[str, str] | None) -> str:
        prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())
        return f"{prefix}/bin/sh -c {shlex.quote(cmd)}"

    def run(self, cmd: str, timeout: float = 120.0, env: dict[str, str] | None = None) -> RunResult:
        from invoke.exceptions import CommandTimedOut

        self._echo(cmd)
        try:
            res = self.conn.run(
                self._wrap(cmd, env), hide=True, warn=True, timeout=timeout, in_stream=False
            )
        except CommandTimedOut as exc:
            return TIMED_OUT, exc.result.stdout, f"timed out after {timeout:.0f}s: {cmd}"
        return res.exited, res.stdout, res.stderr

    def run_logged(
        self,
        cmd: str,
        log_path: Path,
        timeout: float = 3600.0,
        progress: Callable[[str], None] | None = None,
    ) -> int:
        from invoke.exceptions import CommandTimedOut

        self._echo(cmd)
        with _command_log(log_path, cmd, progress) as (log, sink):
            try:
                res = self.conn.run(
                    self._wrap(cmd + " 2>&1", None),
                    hide=True,
                    warn=True,
                    timeout=timeout,
                    out_stream=sink,
                    err_stream=sink,
                    in_stream=False,
                )
            except CommandTimedOut:
                log.write(f"\n[provision] killed after {timeout:.0f}s\n")
                return TIMED_OUT
            return res.exited

    def put(self, local: Path, remote: str) -> None:
        parent = remote.rsplit("/", 1)[0] or "/"
        self.run(f"mkdir -p {shlex.quote(parent)}")
        try:
            self.conn.put(str(local), remote)
        except OSError as exc:
            raise TargetError(f"copying {local} to {self.name}:{remote} failed: {exc}") from exc

    def get(self, remote: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        self.conn.get(remote, str(local))

    def close(self) -> None:
        self.conn.close()


def q(text: str) -> str:
    """Shell-quote for command lines run on a target."""
    return shlex.quote(text)


def controller_arch() -> str:
    """The architecture of the machine running `invoke provision` (not the target)."""
    return os.uname().machine if hasattr(os, "uname") else sys.platform

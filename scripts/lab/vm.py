"""Run the emulated board: qemu-system-aarch64 in the background, reachable over SSH.

One lab at a time per cache root. Its state (pid, port, throwaway keys, known_hosts, console
log) lives in `<cache root>/run/`; `down` stops qemu by the recorded PID after checking that the
PID still belongs to that qemu.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from provision.floor import light
from provision.target import HostSpec, SshTarget, TargetError
from scripts.lab.cache import cache_root
from scripts.lab.images import CPU_MODEL, DEFAULT, image
from scripts.lab.kernel import ensure as ensure_kernel
from scripts.lab.rootfs import ensure as ensure_rootfs
from scripts.lab.rootfs import pack_cpio

atomic = light.load("atomic")

QEMU = "qemu-system-aarch64"
CPUS = 2
BOOT_TIMEOUT_S = float(os.environ.get("TORCH_FL_LAB_BOOT_TIMEOUT", "180"))


class LabError(RuntimeError):
    """The lab cannot do what was asked; the message names the problem and the fix."""


@dataclass(frozen=True)
class LabInfo:
    pid: int
    port: int
    page_size: str
    state_dir: Path
    image: str = DEFAULT

    @property
    def host(self) -> str:
        """`--host` value for `invoke provision`."""
        return f"root@127.0.0.1:{self.port}"

    @property
    def known_hosts(self) -> Path:
        return self.state_dir / "known_hosts"

    @property
    def identity(self) -> Path:
        return self.state_dir / "id_ed25519"

    def ssh_argv(self, batch: bool = True) -> list[str]:
        """ssh command line for this lab (append a remote command, or none for a shell)."""
        return [
            "ssh",
            *(["-o", "BatchMode=yes"] if batch else ["-t"]),
            "-F",
            "/dev/null",
            "-p",
            str(self.port),
            "-i",
            str(self.identity),
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "ConnectTimeout=10",
            "-o",
            "LogLevel=ERROR",
            "root@127.0.0.1",
        ]


def state_dir() -> Path:
    return cache_root() / "run"


def _read_info() -> LabInfo | None:
    path = state_dir() / "lab.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        return LabInfo(
            int(data["pid"]),
            int(data["port"]),
            str(data["page_size"]),
            state_dir(),
            str(data.get("image", DEFAULT)),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        # A truncated or hand-edited state file: no lab this process can know of (one line, no
        # traceback); `lab.up` writes a fresh one.
        print(
            f"lab: ignored the unreadable state file {path} ({type(exc).__name__}: {exc})",
            file=sys.stderr,
        )
        return None


def _is_our_qemu(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(arg.endswith(QEMU.encode()) for arg in cmdline) and str(
        state_dir()
    ).encode() in b" ".join(cmdline)


def running() -> LabInfo | None:
    """The running lab, or None (a stale state file from a dead qemu is ignored)."""
    info = _read_info()
    return info if info is not None and _is_our_qemu(info.pid) else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _keygen(path: Path, comment: str) -> str:
    path.unlink(missing_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
    )
    return path.with_suffix(".pub").read_text().strip()


def _keys_cpio(run: Path) -> tuple[Path, str]:
    """Fresh throwaway host and client keys for this lab, as an initramfs overlay."""
    client_pub = _keygen(run / "id_ed25519", "torch-fl-lab-client")
    host_pub = _keygen(run / "ssh_host_ed25519_key", "torch-fl-lab-host")
    with tempfile.TemporaryDirectory(dir=run) as tmp:
        overlay = Path(tmp)
        ssh = overlay / "etc/ssh"
        ssh.mkdir(parents=True)
        shutil.copy2(run / "ssh_host_ed25519_key", ssh / "ssh_host_ed25519_key")
        shutil.copy2(run / "ssh_host_ed25519_key.pub", ssh / "ssh_host_ed25519_key.pub")
        os.chmod(ssh / "ssh_host_ed25519_key", 0o600)
        dot_ssh = overlay / "root/.ssh"
        dot_ssh.mkdir(parents=True)
        (dot_ssh / "authorized_keys").write_text(client_pub + "\n")
        os.chmod(overlay / "root", 0o700)
        os.chmod(dot_ssh, 0o700)
        os.chmod(dot_ssh / "authorized_keys", 0o600)
        out = run / "keys.cpio.gz"
        pack_cpio(overlay, out)
    return out, host_pub


def _write_known_hosts(run: Path, port: int, host_pub: str) -> None:
    key_type, key_b64 = host_pub.split()[:2]
    atomic.write_text(run / "known_hosts", f"[127.0.0.1]:{port} {key_type} {key_b64}\n")


def _banner(port: int) -> bool:
    # slirp accepts on the forwarded port before the guest listens; only sshd's banner counts.
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
            sock.settimeout(3)
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def target(info: LabInfo, connect_timeout: float = 10.0) -> SshTarget:
    """The running lab as a provisioning `Target` (the same SSH code `invoke provision` uses).

    Its host key is pinned in the lab's known_hosts and it takes the lab's throwaway client key;
    close it when done. Raises TargetError while the guest's sshd does not answer.
    """
    return SshTarget(
        HostSpec("root", "127.0.0.1", info.port),
        known_hosts=str(info.known_hosts),
        identity=str(info.identity),
        connect_timeout=connect_timeout,
    )


def _answers(info: LabInfo) -> bool:
    """sshd's banner is there and a command runs (slirp accepts before the guest listens)."""
    if not _banner(info.port):
        return False
    try:
        board = target(info)
    except TargetError:
        return False
    try:
        return board.run("true", timeout=30)[0] == 0
    finally:
        board.close()


def _concat(parts: list[Path], out: Path) -> None:
    with atomic.replacing(out) as tmp, open(tmp, "wb") as dst:
        for part in parts:
            with open(part, "rb") as src:
                shutil.copyfileobj(src, dst, 1 << 20)


def _wait_ssh(info: LabInfo, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _is_our_qemu(info.pid):
        if _answers(info):
            return True
        time.sleep(1)
    return False


def up(
    page_size: str = "16k", log=print, image_name: str = DEFAULT
) -> tuple[LabInfo, dict[str, float]]:
    """Start the lab booting `image_name` (scripts/lab/images.py), building missing products
    first; return its info and timings.

    Serialized by a lock, so parallel callers (pytest-xdist workers, two shells) share one lab.
    """
    image(image_name)  # an unknown image fails here, before anything is built
    state_dir().mkdir(parents=True, exist_ok=True)
    with open(state_dir() / ".up.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _up_locked(page_size, log, image_name)


def _timed(fn, *args):
    """(fn(*args), seconds it took)."""
    mark = time.monotonic()
    result = fn(*args)
    return result, round(time.monotonic() - mark, 1)


def _up_locked(page_size: str, log, image_name: str) -> tuple[LabInfo, dict[str, float]]:
    current = running()
    if current is not None:
        return _reuse(current, page_size, image_name), {}
    if shutil.which(QEMU) is None:
        raise LabError(f"{QEMU} is missing; fix: apt-get install qemu-system-arm")
    started = time.monotonic()
    timings: dict[str, float] = {}
    kdir, archive = _build_products(page_size, timings, log, image_name)
    timings["products_s"] = round(time.monotonic() - started, 1)
    run = state_dir()
    mark = time.monotonic()
    port = _prepare_boot(run, kdir, archive)
    argv = _qemu_argv(kdir, run, port, image(image_name).memory_mb)
    info, qemu = _start_qemu(argv, run, port, page_size, image_name)
    _await_boot(info, qemu, run)
    timings["boot_s"] = round(time.monotonic() - mark, 1)
    _refresh_apt(info)
    timings["total_s"] = round(time.monotonic() - started, 1)
    return info, timings


def _reuse(current: LabInfo, page_size: str, image_name: str) -> LabInfo:
    """The lab already running, if it is the one asked for and answers."""
    if (current.page_size, current.image) != (page_size, image_name):
        raise LabError(
            f"a {current.page_size} lab with the {current.image!r} image is already running "
            f"(pid {current.pid}), not {page_size} / {image_name!r}; run `invoke lab.down` first"
        )
    if not _wait_ssh(current, BOOT_TIMEOUT_S):
        raise LabError(f"the running lab (pid {current.pid}) does not answer on SSH")
    return current


def _build_products(
    page_size: str, timings: dict[str, float], log, image_name: str
) -> tuple[Path, Path]:
    """The kernel directory and the rootfs archive, from the cache or built now."""
    # The two products are independent (separate private apt trees, separate cache locks), and
    # their costs differ in kind: `make -j2` keeps both cores busy, mmdebstrap under qemu-user
    # mostly waits on one emulated dpkg at a time. Building them side by side fills the idle
    # core (cold timings in docs/board-lab.md).
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="lab-build") as pool:
        kernel_job = pool.submit(_timed, ensure_kernel, page_size)
        rootfs_job = pool.submit(_timed, ensure_rootfs, image_name)
        (kdir, kbuilt), timings["kernel_s"] = kernel_job.result()
        (archive, rbuilt), timings["rootfs_s"] = rootfs_job.result()
    log(f"kernel {'built' if kbuilt else 'cached'}: {kdir}")
    log(f"rootfs ({image_name}) {'built' if rbuilt else 'cached'}: {archive}")
    return kdir, archive


def _prepare_boot(run: Path, kdir: Path, archive: Path) -> int:
    """Fresh keys, the initrd (rootfs + modules + keys) and known_hosts; the forwarded port."""
    run.mkdir(parents=True, exist_ok=True)
    os.chmod(run, 0o700)
    keys, host_pub = _keys_cpio(run)
    parts = [archive]
    if (kdir / "modules.cpio.gz").is_file():
        parts.append(kdir / "modules.cpio.gz")
    _concat([*parts, keys], run / "initrd.cpio.gz")
    port = _free_port()
    _write_known_hosts(run, port, host_pub)
    return port


def _qemu_argv(kdir: Path, run: Path, port: int, memory_mb: int) -> list[str]:
    return [
        "nice",
        "-n",
        "19",
        QEMU,
        "-M",
        "virt,gic-version=3",
        "-cpu",
        CPU_MODEL,
        "-smp",
        str(CPUS),
        "-m",
        str(memory_mb),
        "-accel",
        "tcg,thread=multi",
        "-kernel",
        str(kdir / "Image"),
        "-initrd",
        str(run / "initrd.cpio.gz"),
        "-append",
        # exception-trace: the kernel logs each process it kills for an undefined instruction
        # (qemu's TCG raises spurious ones now and then; docs/board-lab.md).
        "console=ttyAMA0 rdinit=/init panic=-1 sysctl.debug.exception-trace=1",
        "-netdev",
        f"user,id=n0,hostfwd=tcp:127.0.0.1:{port}-:22",
        # Debian's qemu lacks the virtio NIC option ROM; the lab boots without firmware.
        "-device",
        "virtio-net-pci,netdev=n0,romfile=",
        "-display",
        "none",
        "-monitor",
        "none",
        "-serial",
        f"file:{run / 'console.log'}",
        "-no-reboot",
    ]


def _start_qemu(
    argv: list[str], run: Path, port: int, page_size: str, image_name: str
) -> tuple[LabInfo, subprocess.Popen]:
    """qemu in the background, in its own session; its PID recorded for `down`."""
    with open(run / "qemu.log", "w") as qlog:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=qlog,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # survives the invoke process that started it
        )
    state = {"pid": proc.pid, "port": port, "page_size": page_size, "image": image_name}
    atomic.write_text(run / "lab.json", json.dumps(state) + "\n")
    return LabInfo(proc.pid, port, page_size, run, image_name), proc


def _await_boot(info: LabInfo, qemu: subprocess.Popen, run: Path) -> None:
    """Until a command runs over SSH; stops the lab and names the cause if it never does."""
    console = run / "console.log"
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while time.monotonic() < deadline:
        if qemu.poll() is not None:
            raise LabError(
                f"qemu exited with rc {qemu.returncode} during boot; see {run / 'qemu.log'} "
                f"and {console}"
            )
        if _answers(info):
            return
        time.sleep(1)
    down()
    tail = console.read_text(errors="replace")[-2000:] if console.exists() else ""
    raise LabError(
        f"the lab did not answer on SSH within {BOOT_TIMEOUT_S:.0f}s (raise "
        f"TORCH_FL_LAB_BOOT_TIMEOUT on a slow host); console tail:\n{tail}"
    )


def _refresh_apt(info: LabInfo) -> None:
    # The image ships without apt lists (mmdebstrap drops them); index the offline repository
    # now so the guest looks like a board whose lists are current.
    board = target(info)
    try:
        rc, _, err = board.run("apt-get update -qq", timeout=300)
    finally:
        board.close()
    if rc != 0:
        down()
        raise LabError(f"apt-get update in the lab failed: {err.strip()}")


def down(timeout: float = 20.0) -> bool:
    """Stop the running lab by PID; True when one was stopped."""
    info = _read_info()
    if info is None:
        return False
    stopped = False
    if _is_our_qemu(info.pid):
        os.kill(info.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _is_our_qemu(info.pid):
            time.sleep(0.2)
        if _is_our_qemu(info.pid):
            os.kill(info.pid, signal.SIGKILL)
        stopped = True
    for name in ("lab.json", "initrd.cpio.gz", "keys.cpio.gz"):
        (state_dir() / name).unlink(missing_ok=True)
    return stopped

"""The lab's root file systems (scripts/lab/images.py), each packed as an initramfs (cpio.gz).

Built with mmdebstrap (the `board` image: trixie arm64 + amd64 foreign architecture, because
Debian's box64 depends on the amd64 libgcc/libstdc++; the `torch` image: sid arm64), then adjusted for a board without systemd: a small /init brings up the
network and runs sshd under tini. Host keys and authorized_keys are not in the image; each lab
adds its own throwaway keys as a second cpio archive at start (the kernel unpacks concatenated
archives in order).

The guest has no internet, so each image carries an offline apt repository
(/var/local/torch-fl-lab/repo, the only apt source in the image); the `board` image's holds:
- box64 from Debian sid (0.4.x), the upgrade over trixie's preinstalled 0.3.4;
- the amd64 Python 3.13 packages and their amd64 dependencies, for an x86_64 interpreter
  (`apt-get download python3.13-minimal:amd64 ...` + `dpkg-deb -x`, or `apt-get install` of the
  Multi-Arch: same libraries).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from provision.floor import light
from scripts.lab.binfmt import ensure_aarch64
from scripts.lab.cache import get_or_build, lookup
from scripts.lab.debapt import MIRROR, PrivateApt
from scripts.lab.images import BOARD, Image, image

atomic = light.load("atomic")

REPO_DIR = "var/local/torch-fl-lab/repo"
EXCLUDES = ["/usr/share/man/*", "/usr/share/locale/*", "/usr/share/doc/*", "/usr/share/info/*"]

INIT = r"""#!/bin/sh
# torch-fl board lab init: no systemd, just what a provisioning target needs.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm /run/sshd
mount -t devpts -o gid=5,mode=620 devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /run/sshd
hostname rdk-lab
# Debian's stock kernels build virtio-net as a module; the minimal 64K kernel has it built in.
if [ -d "/lib/modules/$(uname -r)" ]; then modprobe virtio_net; fi
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
echo "torch-fl-lab: page size $(getconf PAGESIZE), starting sshd" >/dev/console
exec /usr/bin/tini -- /usr/sbin/sshd -D -e
"""

SSHD_CONF = """# torch-fl board lab: key-only root login for the throwaway per-lab key.
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
UseDNS no
HostKey /etc/ssh/ssh_host_ed25519_key
"""


def inputs(name: str = BOARD.name) -> dict[str, Any]:
    img = image(name)
    found: dict[str, Any] = {
        "suite": img.suite,
        "packages": list(img.packages),
        "repo_sets": [
            [suite, arch, list(pkgs), closure] for suite, arch, pkgs, closure in img.repo_sets
        ],
        "excludes": EXCLUDES,
        "init": INIT,
        "sshd": SSHD_CONF,
        "mirror": MIRROR,
    }
    # The board image's key predates images: it stays what it was (its cached product stays
    # valid); every other image adds what sets it apart.
    if img.architectures != BOARD.architectures:
        found["architectures"] = list(img.architectures)
    if img.byte_compile != BOARD.byte_compile:
        found["byte_compile"] = img.byte_compile
    return found


def cached(name: str = BOARD.name) -> Path | None:
    found = lookup("rootfs", inputs(name))
    return found / "rootfs.cpio.gz" if found else None


def _log(msg: str) -> None:
    print(f"[lab.rootfs] {msg}", flush=True)


def _build_repo(img: Image, dest: Path) -> list[str]:
    names: list[str] = []
    dest.mkdir(parents=True, exist_ok=True)
    for suite, arch, pkgs, closure in img.repo_sets:
        apt = PrivateApt(f"{suite}-{arch}", [suite], arch, [arch])
        apt.update()
        wanted = list(pkgs)
        debs = apt.download_closure(wanted, dest) if closure else apt.download(wanted, dest)
        names += [d.name for d in debs]
    shutil.rmtree(dest / "partial", ignore_errors=True)
    # A flat repository: `deb [trusted=yes] file:/... ./`; trusted because it was built here
    # from packages apt already verified against Debian's keyring when downloading them.
    packages = subprocess.run(
        ["dpkg-scanpackages", "--multiversion", "."],
        cwd=dest,
        check=True,
        capture_output=True,
    ).stdout
    (dest / "Packages").write_bytes(packages)
    return sorted(set(names))


def _adjust(root: Path) -> None:
    (root / "init").write_text(INIT)
    os.chmod(root / "init", 0o755)
    (root / "etc/ssh/sshd_config.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/ssh/sshd_config.d/torch-fl-lab.conf").write_text(SSHD_CONF)
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()  # generated at image build; each lab brings its own throwaway host key
    (root / "root/.ssh").mkdir(mode=0o700, parents=True, exist_ok=True)
    (root / "etc/hostname").write_text("rdk-lab\n")
    # The guest has no network beyond the host: the offline repo is its only apt source.
    (root / "etc/apt/sources.list").unlink(missing_ok=True)
    for src in (root / "etc/apt/sources.list.d").glob("*"):
        src.unlink()
    (root / "etc/apt/sources.list.d/torch-fl-lab.sources").write_text(
        "# Offline repository baked into the board lab image (docs/board-lab.md).\n"
        "Types: deb\nURIs: file:/" + REPO_DIR + "\nSuites: ./\nTrusted: yes\n"
    )


def pack_cpio(root: Path, out: Path) -> None:
    """Pack a directory as a gzip'd newc cpio archive (the initramfs format)."""
    listing = out.with_suffix(".list")
    with open(listing, "wb") as fh:
        # A file list (not a pipe) feeds cpio, so its output pipe can never stall our input.
        subprocess.run(
            "find . -mindepth 1 -print0 | LC_ALL=C sort -z",
            shell=True,
            cwd=root,
            stdout=fh,
            check=True,
        )
    # gzip -1: the archive is rebuilt rarely but unpacked on every boot at the same speed.
    with atomic.replacing(out) as tmp, open(listing, "rb") as names, open(tmp, "wb") as dst:
        cpio = subprocess.Popen(
            ["nice", "-n", "19", "cpio", "--null", "-o", "-H", "newc", "--quiet"],
            cwd=root,
            stdin=names,
            stdout=subprocess.PIPE,
        )
        gz = subprocess.run(["nice", "-n", "19", "gzip", "-1", "-n"], stdin=cpio.stdout, stdout=dst)
        assert cpio.stdout is not None
        cpio.stdout.close()
        if cpio.wait() != 0 or gz.returncode != 0:
            raise RuntimeError(f"cpio/gzip failed packing {root}")
    listing.unlink()


# Where py3compile waits while the packages install without byte-compiling (a local dpkg
# diversion: the package's own file lands there, and goes back before the image is packed).
_PY3COMPILE_ASIDE = "/usr/bin/py3compile.torch-fl-lab"


def _hooks(img: Image) -> list[str]:
    """mmdebstrap hooks the image's recipe needs."""
    if img.byte_compile:
        return []
    divert = f"dpkg-divert --quiet --local --rename --divert {_PY3COMPILE_ASIDE}"
    return [
        # After the essential packages, before the rest: their postinst scripts skip
        # py3compile when it is not on PATH.
        f'--essential-hook=chroot "$1" {divert} --add /usr/bin/py3compile',
        f'--customize-hook=chroot "$1" {divert} --remove /usr/bin/py3compile',
    ]


def build(img: Image, product: Path) -> dict[str, Any]:
    started = time.monotonic()
    ensure_aarch64()
    root = product / "root"
    repo_debs = _build_repo(img, product / "repo-staging")
    argv = [
        "nice",
        "-n",
        "19",
        "mmdebstrap",
        "--mode=root",
        "--variant=apt",
        "--architectures=" + ",".join(img.architectures),
        "--include=" + ",".join(img.packages),
        *[f"--dpkgopt=path-exclude={pat}" for pat in EXCLUDES],
        '--aptopt=Acquire::Languages "none"',
        # A mirror may be a dated snapshot (this project's is): sid's Release file then carries a
        # Valid-Until in the past, which apt refuses by default. The signatures still count.
        '--aptopt=Acquire::Check-Valid-Until "false"',
        *_hooks(img),
        img.suite,
        str(root),
        f"deb {MIRROR} {img.suite} main",
    ]
    _log(f"mmdebstrap {img.suite} {'+'.join(img.architectures)} ({img.name} image; minutes)")
    log = product / "mmdebstrap.log"
    with open(log, "w") as fh:
        rc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"mmdebstrap failed (rc {rc}); log {log}:\n{tail}")
    shutil.move(str(product / "repo-staging"), str(root / REPO_DIR))
    _adjust(root)
    versions = _versions(root, ("box64", "python3", "python3-torch"))
    _log("packing initramfs")
    pack_cpio(root, product / "rootfs.cpio.gz")
    shutil.rmtree(root)
    return {
        "image": img.name,
        "versions": versions,
        "box64_preinstalled": versions["box64"],
        "repo_debs": repo_debs,
        "build_s": round(time.monotonic() - started, 1),
    }


def _versions(root: Path, packages: tuple[str, ...]) -> dict[str, str]:
    """Installed versions of these packages in the image ('' where absent): sid moves daily, so
    the product records what it got."""
    found = {}
    for name in packages:
        found[name] = subprocess.run(
            ["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W", "-f=${Version}", name],
            capture_output=True,
            text=True,
        ).stdout
    return found


def ensure(name: str = BOARD.name) -> tuple[Path, bool]:
    """The cached rootfs archive, building it first when missing; (path, built_now)."""
    img = image(name)
    product, built = get_or_build("rootfs", inputs(name), lambda tmp: build(img, tmp))
    return product / "rootfs.cpio.gz", built

"""Guest kernels with large pages, from Debian's packages only.

- 16k: Debian's ready `linux-image-*-arm64-16k` package (trixie), downloaded and unpacked with
  `dpkg-deb -x` (never installed). Its virtio-net driver is a module, so the handful of modules
  the lab needs are packed into a small cpio archive that is appended to the initramfs.
- 64k: Debian has no 64 KB-page arm64 kernel (the realistic RDK S600 case), so one is built from
  Debian's `linux-source-*` package: allnoconfig plus 64K pages, virtio (pci, net, blk, console),
  initramfs, the pl011 serial console and the POSIX basics a provisioning target needs. About
  6.5 minutes with `make -j2` on 2 cores; cached by version + config.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from scripts.lab.cache import get_or_build, lookup
from scripts.lab.debapt import MIRROR, PrivateApt
from scripts.lab.rootfs import pack_cpio

SUITE = "trixie"
PAGE_SIZES = {"16k": 16384, "64k": 65536}
# Modules the stock 16k kernel needs for the lab's NIC, in load order of dependencies.
MODULES_16K = ["net/core/failover.ko", "drivers/net/net_failover.ko", "drivers/net/virtio_net.ko"]
# Options enabled on top of allnoconfig for the 64k kernel (everything else stays off).
CONFIG_64K = [
    "ARM64_64K_PAGES",
    "ARM64_VA_BITS_48",
    "64BIT",
    "MMU",
    "SMP",
    "MULTIUSER",
    "PRINTK",
    "BUG",
    "ELF_CORE",
    "FUTEX",
    "EPOLL",
    "SIGNALFD",
    "TIMERFD",
    "EVENTFD",
    "SHMEM",
    "AIO",
    "ADVISE_SYSCALLS",
    "POSIX_TIMERS",
    "FILE_LOCKING",
    "SYSVIPC",
    "POSIX_MQUEUE",
    "BLK_DEV_INITRD",
    "RD_GZIP",
    "BINFMT_ELF",
    "BINFMT_SCRIPT",
    "TTY",
    "UNIX98_PTYS",
    "SERIAL_AMBA_PL011",
    "SERIAL_AMBA_PL011_CONSOLE",
    "ARM_AMBA",
    "PCI",
    "PCI_HOST_GENERIC",
    "PCI_ECAM",
    "OF",
    "ARM_GIC_V3",
    "ARM_ARCH_TIMER",
    "NET",
    "INET",
    "UNIX",
    "PACKET",
    "NETDEVICES",
    "NET_CORE",
    "ETHERNET",
    "VIRTIO_MENU",
    "VIRTIO",
    "VIRTIO_PCI",
    "VIRTIO_NET",
    "BLOCK",
    "BLK_DEV",
    "VIRTIO_BLK",
    "VIRTIO_CONSOLE",
    "HW_RANDOM",
    "HW_RANDOM_VIRTIO",
    "DEVTMPFS",
    "DEVTMPFS_MOUNT",
    "PROC_FS",
    "PROC_SYSCTL",
    "SYSFS",
    "TMPFS",
    "TMPFS_POSIX_ACL",
    "INOTIFY_USER",
    "FHANDLE",
    "CGROUPS",
    "NAMESPACES",
    "RTC_CLASS",
    "RTC_DRV_PL031",
    "SECCOMP",
    "FW_LOADER",
    "CPU_IDLE",
    "HIGH_RES_TIMERS",
    "NO_HZ_IDLE",
    "KEYS",
    "CRC32",
]


class KernelError(RuntimeError):
    pass


def _log(msg: str) -> None:
    print(f"[lab.kernel] {msg}", flush=True)


def _apt() -> PrivateApt:
    return PrivateApt(f"{SUITE}-arm64", [SUITE], "arm64", ["arm64"])


def inputs(page_size: str) -> dict[str, Any]:
    if page_size == "16k":
        return {
            "page_size": "16k",
            "suite": SUITE,
            "package": "linux-image-arm64-16k",
            "modules": MODULES_16K,
            "mirror": MIRROR,
        }
    if page_size == "64k":
        return {
            "page_size": "64k",
            "suite": SUITE,
            "source": "linux-source",
            "config": CONFIG_64K,
            "mirror": MIRROR,
        }
    raise KernelError(f"page size {page_size!r} is not supported; use one of 16k, 64k")


def cached(page_size: str) -> Path | None:
    return lookup("kernel", inputs(page_size))


def _image_package(apt: PrivateApt) -> str:
    # The meta package depends on the versioned image, e.g. linux-image-6.12.117+deb13-arm64-16k.
    for dep in apt.depends("linux-image-arm64-16k"):
        name = dep.split()[0]
        if name.startswith("linux-image-") and name.endswith("-arm64-16k"):
            return name
    raise KernelError(f"no linux-image-*-arm64-16k found in Debian {SUITE}")


def _build_16k(product: Path) -> dict[str, Any]:
    apt = _apt()
    apt.update()
    package = _image_package(apt)
    # The -unsigned flavour is the same kernel without the Secure Boot signature.
    debs = apt.download([package + "-unsigned"], product / "deb")
    tree = product / "x"
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(tree)], check=True)
    release = package.removeprefix("linux-image-")
    shutil.move(str(tree / "boot" / f"vmlinuz-{release}"), str(product / "Image"))
    shutil.move(str(tree / "boot" / f"config-{release}"), str(product / "config"))
    mods = product / "mods"
    for rel in MODULES_16K:
        src = tree / "usr/lib/modules" / release / "kernel" / (rel + ".xz")
        if not src.exists():
            src = tree / "lib/modules" / release / "kernel" / (rel + ".xz")
        if not src.exists():
            raise KernelError(f"{package} has no module {rel}; update MODULES_16K")
        dst = mods / "lib/modules" / release / "kernel" / (rel + ".xz")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    for meta in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
        for base in (tree / "usr/lib/modules", tree / "lib/modules"):
            if (base / release / meta).exists():
                shutil.copy2(base / release / meta, mods / "lib/modules" / release / meta)
    subprocess.run(["depmod", "-b", str(mods), release], check=True)
    # trixie is merged-/usr: /lib is a link to usr/lib in the root file system.
    (mods / "usr").mkdir()
    (mods / "lib").rename(mods / "usr/lib")
    pack_cpio(mods, product / "modules.cpio.gz")
    shutil.rmtree(mods)
    shutil.rmtree(tree)
    shutil.rmtree(product / "deb")
    return {"release": release, "package": package + "-unsigned"}


def _build_64k(product: Path) -> dict[str, Any]:
    apt = _apt()
    apt.update()
    meta_deps = [d.split()[0] for d in apt.depends("linux-source")]
    source_pkg = next((d for d in meta_deps if d.startswith("linux-source-")), None)
    if source_pkg is None:
        raise KernelError(f"no linux-source-* package found in Debian {SUITE}")
    debs = apt.download([source_pkg], product / "deb")
    tree = product / "x"
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(tree)], check=True)
    tarball = next((tree / "usr/src").glob("linux-source-*.tar.*"))
    _log(f"unpacking {tarball.name}")
    src = product / "src"
    src.mkdir()
    subprocess.run(
        ["nice", "-n", "19", "tar", "-xf", str(tarball), "-C", str(src), "--strip-components=1"],
        check=True,
    )
    shutil.rmtree(tree)
    shutil.rmtree(product / "deb")
    env = {**os.environ, "ARCH": "arm64", "CROSS_COMPILE": "aarch64-linux-gnu-"}
    make = ["nice", "-n", "19", "make", "-s", "-C", str(src)]
    subprocess.run([*make, "allnoconfig"], env=env, check=True)
    cfg = [str(src / "scripts/config"), "--file", str(src / ".config")]
    for opt in CONFIG_64K:
        cfg += ["--enable", opt]
    cfg += ["--disable", "ARM64_4K_PAGES", "--set-str", "CMDLINE", "", "--disable", "MODULES"]
    subprocess.run(cfg, check=True)
    subprocess.run([*make, "olddefconfig"], env=env, check=True)
    config = (src / ".config").read_text()
    for opt in (
        "ARM64_64K_PAGES",
        "VIRTIO_NET",
        "VIRTIO_PCI",
        "SERIAL_AMBA_PL011_CONSOLE",
        "DEVTMPFS",
        "BLK_DEV_INITRD",
        "UNIX",
        "INET",
        "TMPFS",
        "UNIX98_PTYS",
    ):
        if f"CONFIG_{opt}=y" not in config:
            raise KernelError(f"CONFIG_{opt} did not stick in the 64k kernel config")
    _log("building the 64k kernel with make -j2 (about 10 minutes on 2 idle cores)")
    log = product / "build.log"
    with open(log, "w") as fh:
        rc = subprocess.run(
            [*make, "-j2", "Image"], env=env, stdout=fh, stderr=subprocess.STDOUT
        ).returncode
    if rc != 0:
        raise KernelError(f"64k kernel build failed (rc {rc}):\n{log.read_text()[-3000:]}")
    shutil.copy2(src / "arch/arm64/boot/Image", product / "Image")
    (product / "config").write_text(config)
    release = (src / "include/config/kernel.release").read_text().strip()
    shutil.rmtree(src)
    return {"release": release, "package": source_pkg}


def ensure(page_size: str) -> tuple[Path, bool]:
    """Cached kernel product dir (Image, config, maybe modules.cpio.gz); (dir, built_now)."""
    builder = {"16k": _build_16k, "64k": _build_64k}.get(page_size)
    if builder is None:
        raise KernelError(f"page size {page_size!r} is not supported; use one of 16k, 64k")

    def timed(product: Path) -> dict[str, Any]:
        started = time.monotonic()
        meta = builder(product)
        return {**meta, "build_s": round(time.monotonic() - started, 1)}

    return get_or_build("kernel", inputs(page_size), timed)

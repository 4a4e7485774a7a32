"""A self-contained x86_64 CPython tarball made from Debian's amd64 packages.

On a real board provisioning unpacks a pinned relocatable CPython (python-build-standalone);
that download is not reachable from here, so the lab makes an equivalent tarball from Debian
trixie's amd64 python3.13 packages with the same layout (`python/bin/python3.13`,
`python/lib/...`, the x86_64 shared libraries it needs in `python/lib`, and pip from Debian's
python3-pip-whl) and hands it to `invoke provision --artifacts` with a matching config override.
Debian's EXTERNALLY-MANAGED marker is dropped: this interpreter is a private copy, not the
distro's.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path
from typing import Any

from scripts.lab.cache import get_or_build, metadata
from scripts.lab.debapt import MIRROR, PrivateApt

SUITE = "trixie"
PACKAGES = ["python3.13-minimal", "libpython3.13-stdlib", "python3-pip-whl"]
# Debian packages the stdlib closure pulls in that carry nothing an interpreter needs.
SKIP = ("libc6_", "gcc-14-base_", "libgcc-s1_", "tzdata_", "debconf_", "readline-common_")
TARBALL = "torch-fl-lab-cpython-3.13-x86_64-debian.tar.gz"


def inputs() -> dict[str, Any]:
    return {"suite": SUITE, "packages": PACKAGES, "skip": SKIP, "mirror": MIRROR}


def _build(product: Path) -> dict[str, Any]:
    apt = PrivateApt(f"{SUITE}-amd64", [SUITE], "amd64", ["amd64"])
    apt.update()
    debs = apt.download_closure(PACKAGES, product / "debs")
    tree = product / "x"
    for deb in debs:
        if not deb.name.startswith(SKIP):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(tree)], check=True)
    py = product / "stage" / "python"
    (py / "bin").mkdir(parents=True)
    shutil.copy2(tree / "usr/bin/python3.13", py / "bin/python3.13")
    (py / "bin/python3").symlink_to("python3.13")
    shutil.copytree(tree / "usr/lib/python3.13", py / "lib/python3.13", symlinks=True)
    (py / "lib/python3.13/EXTERNALLY-MANAGED").unlink(missing_ok=True)
    for lib in (tree / "usr/lib/x86_64-linux-gnu").glob("*.so*"):
        shutil.copy2(lib, py / "lib" / lib.name, follow_symlinks=False)
    for lib in (tree / "lib/x86_64-linux-gnu").glob("*.so*") if (tree / "lib").is_dir() else []:
        shutil.copy2(lib, py / "lib" / lib.name, follow_symlinks=False)
    # Debian's site.py puts <prefix>/lib/python3/dist-packages on sys.path.
    dist = py / "lib/python3/dist-packages"
    dist.mkdir(parents=True)
    wheel = next((tree / "usr/share/python-wheels").glob("pip-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(dist)
    out = product / TARBALL
    with tarfile.open(out, "w:gz", compresslevel=6) as tar:
        tar.add(py, arcname="python")
    version = subprocess.run(
        ["dpkg-deb", "-f", str(next(d for d in debs if "python3.13-minimal_" in d.name))]
        + ["Version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    for path in (tree, product / "stage", product / "debs"):
        shutil.rmtree(path)
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    return {"tarball": TARBALL, "sha256": digest, "debian_version": version, "python": "3.13"}


def ensure() -> tuple[Path, dict[str, Any]]:
    """(tarball path, metadata) of the cached interpreter tarball, building it when missing."""
    product, _ = get_or_build("x86python", inputs(), _build)
    return product / TARBALL, metadata(product)


def provision_pin(meta: dict[str, Any]) -> dict[str, Any]:
    """The `x86_python.tarball` config block that makes provisioning use this tarball."""
    return {
        "version": "3.13.0",  # provisioning derives bin/python<major.minor> from this
        "url": "https://lab.invalid/offline-only/" + meta["tarball"],  # never fetched: --artifacts
        "sha256": meta["sha256"],
        "filename": meta["tarball"],
    }

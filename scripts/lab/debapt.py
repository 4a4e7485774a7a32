"""A private apt tree for fetching Debian packages of another release/architecture.

The host's own apt configuration (its release, its architectures) is left untouched: every call
points apt at a directory in the lab cache with its own sources, lists and archives. Packages are
only downloaded (`apt-get download`, `--download-only`) and unpacked with `dpkg-deb -x`; nothing
is installed on the host.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from scripts.lab.cache import cache_root

MIRROR = os.environ.get("TORCH_FL_LAB_MIRROR", "http://deb.debian.org/debian")
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


class AptError(RuntimeError):
    """An apt step failed; the message carries apt's own error and the fix."""


class PrivateApt:
    def __init__(self, name: str, suites: list[str], native_arch: str, archs: list[str]) -> None:
        self.root = cache_root() / "apt" / name
        self.suites = suites
        self.native_arch = native_arch
        self.archs = archs

    def _opts(self) -> list[str]:
        opts = [
            f"-oDir={self.root}",
            f"-oDir::State::status={self.root}/status",
            f"-oDir::Etc::Trusted={KEYRING}",
            "-oDir::Etc::TrustedParts=/nonexistent",
            f"-oAPT::Architecture={self.native_arch}",
            "-oAPT::Architectures=",
            "-oAPT::Sandbox::User=root",  # downloads land in root-owned dirs
            "-oAcquire::Languages=none",
            "-qq",
        ]
        opts += [f"-oAPT::Architectures::={a}" for a in self.archs]
        return opts

    def update(self) -> None:
        for sub in ("etc/apt/apt.conf.d", "etc/apt/preferences.d", "etc/apt/sources.list.d"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
        (self.root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
        (self.root / "status").touch()
        archs = ",".join(self.archs)
        lines = [f"deb [arch={archs}] {MIRROR} {suite} main" for suite in self.suites]
        (self.root / "etc/apt/sources.list").write_text("\n".join(lines) + "\n")
        self._run(["apt-get", "update"])

    def _run(self, argv: list[str], cwd: Path | None = None) -> str:
        cmd = [argv[0], *self._opts(), *argv[1:]]
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise AptError(
                f"{' '.join(argv)} failed (rc {proc.returncode}): {proc.stderr.strip()[-2000:]}\n"
                f"fix: check that {MIRROR} is reachable (or set TORCH_FL_LAB_MIRROR to a Debian "
                "mirror) and that the package names exist in the suites "
                f"{', '.join(self.suites)}"
            )
        return proc.stdout

    def candidate(self, package: str) -> str:
        """Candidate version of a package, '' when apt knows none."""
        out = self._run(["apt-cache", "policy", package])
        for line in out.splitlines():
            if line.strip().startswith("Candidate:"):
                value = line.split(":", 1)[1].strip()
                return "" if value == "(none)" else value
        return ""

    def depends(self, package: str) -> list[str]:
        out = self._run(["apt-cache", "depends", "--no-recommends", "--no-suggests", package])
        return [ln.split(":", 1)[1].strip() for ln in out.splitlines() if "Depends:" in ln]

    def download(self, packages: list[str], dest: Path) -> list[Path]:
        """Download exactly these packages (name or name=version) into dest."""
        dest.mkdir(parents=True, exist_ok=True)
        before = set(dest.glob("*.deb"))
        self._run(["apt-get", "download", *packages], cwd=dest)
        return sorted(set(dest.glob("*.deb")) - before)

    def download_closure(self, packages: list[str], dest: Path) -> list[Path]:
        """Download packages plus every dependency, as if installing on an empty system."""
        dest.mkdir(parents=True, exist_ok=True)
        self._run(
            [
                "apt-get",
                "install",
                "--download-only",
                "--no-install-recommends",
                "-y",
                f"-oDir::Cache::archives={dest}",
                *packages,
            ]
        )
        (dest / "lock").unlink(missing_ok=True)
        return sorted(dest.glob("*.deb"))

"""STAND-IN hbdk4 wheels for the board lab: exercise only the install + import path.

Real hbdk4 cannot exist in the lab (vendor wheels, x86_64 only). These two wheels carry the
same project names provisioning asks for (hbdk4_compiler, hbdk4_march) and a package `hbdk4`
whose `hbdk4.compiler` module imports and reports a stand-in version; nothing compiles.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

VERSION = "0.0.0+standin"
_FILES = {
    "hbdk4_compiler": {
        "hbdk4/__init__.py": '"""STAND-IN hbdk4 (torch-fl board lab); not the vendor package."""\n'
        f'__version__ = "{VERSION}"\n',
        "hbdk4/compiler/__init__.py": '"""STAND-IN hbdk4.compiler: import path only."""\n'
        f'__version__ = "{VERSION}"\nSTANDIN = True\n',
    },
    "hbdk4_march": {
        "hbdk4_march_standin/__init__.py": '"""STAND-IN for the hbdk4 march wheel."""\n',
    },
}


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def make_wheels(dest: Path) -> list[Path]:
    """Write the two stand-in wheels into dest; return their paths."""
    dest.mkdir(parents=True, exist_ok=True)
    out: list[Path] = []
    for project, files in _FILES.items():
        info = f"{project}-0.0.0.dist-info"
        entries = dict(files)
        entries[f"{info}/METADATA"] = (
            f"Metadata-Version: 2.1\nName: {project}\nVersion: 0.0.0\n"
            "Summary: STAND-IN for tests (torch-fl board lab)\n"
        )
        entries[f"{info}/WHEEL"] = (
            "Wheel-Version: 1.0\nGenerator: torch-fl-standin\nRoot-Is-Purelib: true\n"
            "Tag: py3-none-any\n"
        )
        record = [_record_line(n, t.encode()) for n, t in entries.items()]
        record.append(f"{info}/RECORD,,")
        entries[f"{info}/RECORD"] = "\n".join(record) + "\n"
        path = dest / f"{project}-0.0.0-py3-none-any.whl"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, text in entries.items():
                # Fixed timestamps: identical bytes on every build, so provisioning (which
                # pins --oe-wheels by sha256) sees the same wheels across sessions.
                zf.writestr(zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0)), text)
        out.append(path)
    return out

"""The board's Python environment for torch-fl: a venv with torch and the pinned wheels.

torch comes from one configured source: a wheelhouse passed with `--artifacts` (offline boards),
the distribution's package (Debian's python3-torch, the only aarch64 CPU torch some boards can
reach), or a pinned index (PyTorch's CPU index: PyPI's aarch64 torch is a CUDA build of several
GB). The rest (numpy, onnx, onnxruntime, xxhash, pyyaml) is pinned by version and, where the
wheelhouse has them, installed from its checksummed files. A marker records what was asked for;
the next run compares it and re-imports everything, so a second run performs no action.

On this machine (a local run) the project's own environment is torch-fl's (scripts/bootstrap.sh
makes it, build_verify builds there): the step applies to remote targets only.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

from provision import artifacts, wheels
from provision.context import Context
from provision.results import (
    NEEDED,
    OK,
    CheckResult,
    Inputs,
    StepError,
    TorchEnvFound,
    not_applicable,
)
from provision.steps.prereqs import apt_install

MARKER = ".complete.json"
SOURCES = ("auto", "wheelhouse", "index", "distro")
LOCAL_ONLY = (
    "this machine: torch-fl runs in the project's environment (scripts/bootstrap.sh), which "
    "build_verify builds"
)
# The import name where it is not the distribution's (pyyaml -> yaml).
IMPORT_NAMES = {"pyyaml": "yaml"}
# Printed by the target's python: torch and every pinned distribution, each imported.
_PROBE = """
import importlib, importlib.metadata as m, json, torch
dists = __DISTS__
for name in dists.values():
    importlib.import_module(name)
print("TFL_ENV " + json.dumps({"torch": torch.__version__,
                               "dists": {d: m.version(d) for d in dists}}))
"""


def root_dir(ctx: Context) -> str:
    return f"{ctx.prefix}/torch-env"


def venv_python(ctx: Context) -> str:
    return f"{root_dir(ctx)}/venv/bin/python"


def pinned(ctx: Context) -> list[str]:
    return list(ctx.config.torch_env.wheels)


def _release(version: str) -> tuple[int, ...]:
    """2.14.1+cpu -> (2, 14, 1): the release part a range compares."""
    parts = re.match(r"\d+(\.\d+)*", version.strip())
    return tuple(int(p) for p in parts.group(0).split(".")) if parts else ()


def in_range(version: str, spec: str) -> bool:
    """Whether `version` meets a comma list of >=, >, <=, <, == clauses (`>=2.10,<2.15`)."""
    have = _release(version)
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        op, want = re.match(r"(>=|<=|==|>|<)\s*(\S+)", clause).groups()  # type: ignore[union-attr]
        ref = _release(want)
        width = max(len(have), len(ref))
        a, b = have + (0,) * (width - len(have)), ref + (0,) * (width - len(ref))
        ok = {">=": a >= b, "<=": a <= b, "==": a == b, ">": a > b, "<": a < b}[op]
        if not ok:
            return False
    return True


def probe(ctx: Context, python: str, with_pins: bool = True) -> tuple[dict[str, Any] | None, str]:
    """({torch, dists}, raw output) when `python` imports torch and (`with_pins`) the pinned
    wheels."""
    names = [wheels.normalize(re.split(r"[<>=!~ ]", w, maxsplit=1)[0]) for w in pinned(ctx)]
    dists = {n: IMPORT_NAMES.get(n, n) for n in names} if with_pins else {}
    snippet = _PROBE.replace("__DISTS__", repr(dists))
    clean = "env -u PYTHONPATH -u PYTHONHOME TORCH_DEVICE_BACKEND_AUTOLOAD=0"
    rc, out, err = ctx.sh(f"{clean} {shlex.quote(python)} -c {shlex.quote(snippet)}", timeout=600)
    for line in out.splitlines():
        if line.startswith("TFL_ENV "):
            return json.loads(line[len("TFL_ENV ") :]), line
    return None, (out + err).strip()[-400:]


def wheelhouse(ctx: Context) -> dict[str, str]:
    """{file name: sha256} of the wheels in --artifacts (empty without one)."""
    directory = ctx.options.artifacts
    if directory is None or not directory.is_dir():
        return {}
    return {p.name: artifacts.sha256_of(p) for p in sorted(directory.glob("*.whl")) if p.is_file()}


def has_torch_wheel(found: dict[str, str], version: str) -> bool:
    return any(
        wheels.wheel_project(n) == "torch" and _release(n.split("-")[1]) == _release(version)
        for n in found
    )


class TorchEnv:
    name = "torch_env"
    title = "Python environment with torch for torch-fl"
    requires: tuple[str, ...] = ()

    def request(self, ctx: Context) -> dict[str, Any]:
        """What this run asks for; the marker keeps it, a change means a reinstall."""
        torch = ctx.config.torch_env.torch
        house = wheelhouse(ctx)
        source = self.source(ctx, house)
        return {
            "source": source,
            "torch": torch.version if source != "distro" else torch.supported,
            "index_url": torch.index_url if source == "index" else "",
            "wheels": pinned(ctx),
            "wheelhouse": house,
        }

    def source(self, ctx: Context, house: dict[str, str]) -> str:
        torch = ctx.config.torch_env.torch
        chosen = torch.source
        if chosen != "auto":
            return chosen
        if has_torch_wheel(house, torch.version):
            return "wheelhouse"
        # torch alone decides: a board with Debian's torch but no onnx yet is a distro board
        # (the venv sees its torch and pip adds the rest).
        found, _ = probe(ctx, ctx.config.torch_env.python, with_pins=False)
        if found is not None and in_range(found["torch"], torch.supported):
            return "distro"
        return "index"

    def check(self, ctx: Context, inputs: Inputs) -> CheckResult:
        if ctx.target.is_local:
            return not_applicable(LOCAL_ONLY)
        root = root_dir(ctx)
        facts: dict[str, Any] = {"root": root}
        marker = ctx.read_marker(f"{root}/{MARKER}")
        if marker is None:
            rc, out, _ = ctx.sh(f"test -e {shlex.quote(root)} && echo exists")
            if out.strip() == "exists":
                return CheckResult(NEEDED, facts, f"partial environment at {root}: will redo")
            return CheckResult(NEEDED, facts, "no Python environment for torch-fl yet")
        wanted = self.request(ctx)
        facts["source"] = wanted["source"]
        if marker.get("request") != wanted:
            return CheckResult(NEEDED, facts, "the pins or the wheelhouse changed: reinstall")
        python = venv_python(ctx)
        found, raw = probe(ctx, python)
        if found is None:
            return CheckResult(NEEDED, facts, f"{python} no longer imports torch-fl's needs: {raw}")
        facts.update(torch=found["torch"], dists=found["dists"])
        for name, sha in wanted["wheelhouse"].items():
            ctx.recorded_artifacts.append({"name": name, "sha256": sha})
        provides = TorchEnvFound(python, found["torch"], wanted["source"])
        return CheckResult(OK, facts, f"torch {found['torch']} ({wanted['source']})", provides)

    # -- apply -----------------------------------------------------------------------------
    def apply(self, ctx: Context, before: CheckResult, inputs: Inputs) -> None:
        wanted = self.request(ctx)
        root = root_dir(ctx)
        r = shlex.quote(root)
        ctx.sh(f"rm -rf {r} && mkdir -p {r}")
        if wanted["source"] == "distro":
            self.distro_torch(ctx)
        base = shlex.quote(ctx.config.torch_env.python)
        system = " --system-site-packages" if wanted["source"] == "distro" else ""
        make_venv = f"rm -rf {r}/venv && {base} -m venv{system} {r}/venv"
        rc, log = ctx.run_long(self.name, make_venv, timeout=600)
        if rc != 0 and ctx.facts.get("apt"):  # Debian keeps ensurepip in python3-venv
            apt_install(ctx, self.name, ["python3-venv"])
            rc, log = ctx.run_long(self.name, make_venv, timeout=600)
        if rc != 0:
            raise StepError(f"creating a venv with {base} failed; see {log} (python3-venv?)")
        stage = self.ship_wheelhouse(ctx, wanted["wheelhouse"], f"{root}/wheels")
        self.pip_install(ctx, wanted, stage)
        found, raw = probe(ctx, venv_python(ctx))
        if found is None:
            raise StepError(f"the new environment does not import torch-fl's needs: {raw}")
        ctx.write_marker(f"{root}/{MARKER}", {"request": wanted, "torch": found["torch"]})

    def distro_torch(self, ctx: Context) -> None:
        torch = ctx.config.torch_env.torch
        found, _ = probe(ctx, ctx.config.torch_env.python, with_pins=False)
        if found is None:
            apt_install(ctx, self.name, list(torch.distro_packages))
            found, raw = probe(ctx, ctx.config.torch_env.python, with_pins=False)
            if found is None:
                raise StepError(
                    f"after installing {list(torch.distro_packages)}, "
                    f"{ctx.config.torch_env.python} still does not import torch: {raw}"
                )
        if not in_range(found["torch"], torch.supported):
            raise StepError(
                f"the distribution's torch is {found['torch']}, outside torch-fl's supported "
                f"{torch.supported}; set torch_env.torch.source to wheelhouse or index"
            )

    def ship_wheelhouse(self, ctx: Context, house: dict[str, str], stage: str) -> str:
        if not house:
            return ""
        assert ctx.options.artifacts is not None
        ctx.sh(f"mkdir -p {shlex.quote(stage)}")
        for name, sha in house.items():
            artifacts.ship(ctx, Path(ctx.options.artifacts) / name, stage, sha)
        return stage

    def pip_install(self, ctx: Context, wanted: dict[str, Any], stage: str) -> None:
        python = shlex.quote(venv_python(ctx))
        pip = f"{python} -m pip install --disable-pip-version-check"
        links = f" --find-links {shlex.quote(stage)}" if stage else ""
        torch = f"torch=={ctx.config.torch_env.torch.version}"
        steps = []
        if wanted["source"] == "wheelhouse":
            # Only the wheelhouse's torch: beside an index pip could pick the index's build.
            steps.append(f"{pip} --no-index{links} --no-deps {shlex.quote(torch)}")
            steps.append(f"{pip}{links} {shlex.quote(torch)}")  # torch's own dependencies
        elif wanted["source"] == "index":
            url = shlex.quote(wanted["index_url"])
            steps.append(f"{pip} --index-url {url} --no-deps {shlex.quote(torch)}")
            steps.append(f"{pip}{links} {shlex.quote(torch)}")
        pins = " ".join(shlex.quote(w) for w in wanted["wheels"])
        timeout = ctx.config.torch_env.timeout_s
        if links:
            # The wheelhouse alone first: an offline board answers every index query only after
            # pip's retries (seconds per package); a wheelhouse with gaps falls back to the index.
            steps.append(f"{pip} --no-index{links} {pins} || {pip}{links} {pins}")
        else:
            steps.append(f"{pip} {pins}")
        for cmd in steps:
            rc, log = ctx.run_long(self.name, cmd, timeout=timeout)
            if rc != 0:
                raise StepError(
                    f"installing into {venv_python(ctx)} failed (rc {rc}); see {log}. Offline: "
                    "put every wheel it needs (pip download --platform ... -d DIR) in --artifacts"
                )


STEP = TorchEnv()

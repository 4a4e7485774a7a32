"""Parallel provisioning of N hosts vs the slowest single host (target: at most 1.3x).

Hosts: loopback sshd "boards" (x86_64, a fresh sshd with empty XDG dirs for every run, so each
run really writes its env file) and, unless --no-lab, a private instance of the emulated 64 KB
board booted from the lab's cache. The lab is provisioned once before measuring, so every
measured lab run is the same warm run (checks, box64 probe under TCG, zero actions). In each
round every host is provisioned alone, then all at once, through the same code path
(provision.multihost.provision_hosts), in one process.

    .venv/bin/python scripts/bench_farm_provision.py --sshd 2 --rounds 2
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from provision import config as config_mod  # noqa: E402
from provision import plan  # noqa: E402
from provision.multihost import (  # noqa: E402
    HostJob,
    ProvisionRequest,
    RunPlaces,
    provision_hosts,
)
from provision.steps import Options  # noqa: E402
from provision.target import parse_host  # noqa: E402

SKIP = "x86_python,vendor_runtime,torch_env,torch_fl,build_verify"


def _run(jobs: list[HostJob], cfg: config_mod.Settings, steps: list[str], work: Path) -> float:
    start = time.monotonic()
    request = ProvisionRequest(cfg, tuple(steps), Options())
    code, results, _ = provision_hosts(jobs, request, RunPlaces(work / "out", work / "cache"))
    took = time.monotonic() - start
    bad = [f"{r.name}: {r.status} {r.error or ''}" for r in results if r.status != "ok"]
    if code or bad:
        raise SystemExit(f"provisioning failed: {bad}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sshd", type=int, default=2, help="loopback sshd boards (default 2)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-lab", action="store_true", help="leave the emulated board out")
    args = parser.parse_args()
    import io
    from contextlib import redirect_stdout

    from scripts.farm.emu import PrivateLab
    from tests.support.sshd import SshServer

    cfg = config_mod.load(None, None)
    steps = plan.select(None, SKIP, cfg.steps.skip)
    root = Path(tempfile.mkdtemp(prefix="bench-farm-"))
    known = root / "known_hosts"
    lab = None
    lab_job = None
    if not args.no_lab:
        lab = PrivateLab(root / "lab")
        info = lab.start()
        known.write_text(info.known_hosts.read_text())
        lab_job = HostJob(parse_host(info.host), identity=str(info.identity), label="lab")
    servers: list[SshServer] = []
    counter = iter(range(10_000))

    def fresh_sshd(label: str) -> HostJob:
        server = SshServer(root / f"sshd{next(counter)}")
        servers.append(server)
        with open(known, "a") as fh:
            fh.write(f"[127.0.0.1]:{server.port} {' '.join(server.host_pub.split()[:2])}\n")
        return HostJob(parse_host(server.host), identity=str(server.user_key), label=label)

    cfg = dataclasses.replace(cfg, ssh=dataclasses.replace(cfg.ssh, known_hosts=str(known)))
    times: dict[str, list[float]] = {}
    try:
        quiet = io.StringIO()
        if lab_job is not None:
            with redirect_stdout(quiet):
                warm = _run([lab_job], cfg, steps, root / "warmup")
            print(f"lab warm-up (first provisioning, not measured): {warm:.1f}s")
        for rnd in range(args.rounds):
            singles = {}
            names = [f"sshd{i}" for i in range(args.sshd)] + (["lab"] if lab_job else [])
            for name in names:
                job = lab_job if name == "lab" else fresh_sshd(name)
                with redirect_stdout(quiet):
                    singles[name] = _run([job], cfg, steps, root / f"r{rnd}-{name}")
            jobs = [lab_job if n == "lab" else fresh_sshd(n) for n in names]
            with redirect_stdout(quiet):
                parallel = _run(jobs, cfg, steps, root / f"r{rnd}-all")
            slowest = max(singles.values())
            for name, took in singles.items():
                times.setdefault(name, []).append(took)
            times.setdefault("parallel", []).append(parallel)
            times.setdefault("ratio", []).append(parallel / slowest)
            alone = ", ".join(f"{n} {t:.1f}s" for n, t in singles.items())
            print(f"round {rnd + 1}: alone: {alone}; all {len(jobs)} in parallel: "
                  f"{parallel:.1f}s; ratio to slowest {parallel / slowest:.2f}")  # fmt: skip
    finally:
        for server in servers:
            server.stop()
        if lab is not None:
            lab.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"median over {args.rounds} rounds: parallel {med['parallel']:.1f}s, "
        f"parallel / slowest single host = {med['ratio']:.2f} (target <= 1.30)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Real runs of `invoke provision` on this machine, with HOME/XDG dirs under a temp dir."""

from __future__ import annotations

import json
import os
from pathlib import Path

from provision import report
from provision.floor import light

REPO = Path(__file__).resolve().parents[2]


def snapshot(root: Path) -> dict[str, float]:
    skip = root / "cache"  # the controller's own download/probe cache is not the target
    return {
        str(p): p.stat().st_mtime
        for p in root.rglob("*")
        if skip not in p.parents and p.suffix != ".json"
    }


def load_env_reader():
    """torch_fl.envfile without `import torch_fl` (which needs the built extension)."""
    return light.load("envfile")


def test_dry_changes_nothing(iso, fast_config, provision_cli):
    root, env = iso
    before = snapshot(root)
    rep = root / "r.json"
    res = provision_cli(env, "--dry", "--config", str(fast_config), "--report", str(rep))
    assert res.returncode == 0, res.stdout + res.stderr
    # A dry run's report goes beside the real one (r.dry.json), never over it.
    assert not rep.exists()
    doc = json.loads((root / "r.dry.json").read_text())
    (root / "r.dry.json").unlink()
    assert snapshot(root) == before
    report.validate(doc)
    assert doc["dry"] is True and doc["actions"] == 0
    actions = {s["name"]: s["action"] for s in doc["steps"]}
    assert actions["x86_python"] == "would apply"
    assert actions["envfile"] == "would apply"
    assert "build_verify" not in actions


def test_apply_then_second_run_is_idempotent(iso, fast_config, provision_cli):
    root, env = iso
    rep = root / "apply.json"
    first = provision_cli(env, "--config", str(fast_config), "--report", str(rep))
    assert first.returncode == 0, first.stdout + first.stderr
    doc = json.loads(rep.read_text())
    report.validate(doc)
    applied = {s["name"] for s in doc["steps"] if s["action"] == "apply"}
    assert {"x86_python", "envfile"} <= applied
    assert all(s["after"]["status"] == "ok" for s in doc["steps"] if s["action"] == "apply")
    assert "step" in first.stdout and "hbdk4 not provided" in first.stdout

    env_file = root / "config" / "torch-fl" / "env"
    values = load_env_reader().load_env_file(env_file)
    py = values["FLAGOS_BPU_X86_PYTHON"]
    assert py.startswith(str(root / "data" / "torch-fl"))
    assert os.access(py, os.X_OK)
    assert values["FLAGOS_BPU_MARCH"] == "nash-e"
    assert values["FLAGOS_BPU_CACHE"] == str(root / "cache" / "torch-fl" / "bpu")
    assert "FLAGOS_BPU_EMULATOR" not in values  # x86_64 host: no emulator, ever

    second = provision_cli(env, "--config", str(fast_config), "--report", str(rep))
    assert second.returncode == 0, second.stdout + second.stderr
    doc2 = json.loads(rep.read_text())
    assert doc2["actions"] == 0
    assert [s["action"] for s in doc2["steps"]] == ["none"] * len(doc2["steps"])


def test_interrupted_install_is_redone(iso, fast_config, provision_cli):
    root, env = iso
    rep = root / "r.json"
    assert provision_cli(env, "--config", str(fast_config), "--report", str(rep)).returncode == 0
    # Simulate an interrupted run: files present, completion marker (written last) absent.
    marker = root / "data" / "torch-fl" / "x86-python" / ".complete.json"
    marker.unlink()
    dry = provision_cli(env, "--dry", "--only", "x86_python", "--report", str(rep))
    step = json.loads(rep.with_name(f"{rep.stem}.dry.json").read_text())["steps"][0]
    assert dry.returncode == 0 and step["before"]["status"] == "needed"
    assert "partial install" in step["before"]["detail"]
    again = provision_cli(env, "--only", "x86_python", "--report", str(rep))
    assert again.returncode == 0, again.stdout + again.stderr
    assert marker.exists()
    assert json.loads(rep.read_text())["actions"] == 1


def test_bad_input_exits_2(iso, provision_cli, tmp_path):
    root, env = iso
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy:\n  min_box64: 'zero point four'\n")
    res = provision_cli(env, "--config", str(bad), "--dry")
    assert (
        res.returncode == 2
        and "policy.min_box64" in res.stderr
        and "MAJOR.MINOR.PATCH" in res.stderr
    )
    res = provision_cli(env, "--only", "box65", "--dry")
    assert res.returncode == 2 and "unknown step" in res.stderr
    res = provision_cli(env, "--host", "user@@host:99999", "--dry")
    assert res.returncode == 2 and "user@addr[:port]" in res.stderr
    res = provision_cli(env, "--artifacts", str(tmp_path / "nope"), "--dry")
    assert res.returncode == 2 and "--artifacts" in res.stderr


def test_root_collection_exposes_provision():
    import subprocess
    import sys

    res = subprocess.run(
        [sys.executable, "-m", "invoke", "--list"], cwd=REPO, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert any(line.split()[:1] == ["provision"] for line in res.stdout.splitlines())


def test_build_verify_compiles_with_bpu_backend(iso, provision_cli):
    """The default run's last step: a real torch.compile(backend="bpu") compared with eager."""
    if not list((REPO / "torch_fl").glob("_C*.so")):
        import pytest

        pytest.skip("torch_fl._C is not built yet (invoke build)")
    root, env = iso
    rep = root / "bv.json"
    res = provision_cli(env, "--dry", "--only", "build_verify", "--report", str(rep))
    assert res.returncode == 0, res.stdout + res.stderr
    step = json.loads((root / "bv.dry.json").read_text())["steps"][0]
    result = step["before"]["facts"]["result"]
    assert step["before"]["status"] == "ok", step["before"]["detail"]
    assert result["backend_registered"] is True
    assert result["cosine"] >= 0.98
    # what ran the partitions, from explain() (no board, no hbdk4 here: eager or sim)
    assert set(result["executor"].split(", ")) <= {"eager", "sim"}, result["executor"]

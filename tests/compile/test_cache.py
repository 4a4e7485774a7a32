import json
import multiprocessing
import time

import pytest
import torch
from torch import nn

from tests.compile.bpu_helpers import compile_bpu
from torch_fl.bpu import report
from torch_fl.bpu.cache import ArtifactCache


def _key(fn, *inputs, **options):
    with report.collect() as reps, torch.no_grad():
        compile_bpu(fn, executor="sim", **options)(*inputs)
    torch._dynamo.reset()
    return reps[0].runtimes[0].last_build.artifact.key


class Sub(nn.Module):
    def __init__(self, swap: bool, k: float):
        super().__init__()
        self.swap, self.k = swap, k

    def forward(self, x, y):
        return ((y - x) if self.swap else (x - y)) * self.k


def test_keys_cover_args_wiring_and_every_weight_byte():
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    assert _key(Sub(False, 2.0), x, y) != _key(Sub(True, 3.0), x, y)
    # wiring: same ops, different operands
    assert _key(lambda a, b: (a - b) * a, x, y) != _key(lambda a, b: (a - b) * b, x, y)

    conv = nn.Conv2d(3, 4, 3, padding=1).eval()
    conv0 = nn.Conv2d(3, 4, 3, padding=0).eval()
    conv0.load_state_dict(conv.state_dict())
    img = torch.randn(1, 3, 8, 8)
    assert _key(conv, img) != _key(conv0, img)

    big = nn.Linear(512, 512).eval()
    k1 = _key(big, torch.randn(1, 512))
    with torch.no_grad():
        big.weight[300, 17] += 1e-3  # one element of a 262144-element tensor
    assert _key(big, torch.randn(1, 512)) != k1


def _writer(root, key, log, barrier):
    cache = ArtifactCache(root)
    barrier.wait()

    def build():
        with open(log, "a") as fh:
            fh.write("built\n")
        time.sleep(0.2)  # widen the race window
        return {"model.onnx": b"x" * 100000}, {"march": "nash-e"}

    art, _ = cache.get_or_build(key, build)
    assert (art.path / "model.onnx").read_bytes() == b"x" * 100000


def test_concurrent_processes_build_once_and_never_tear(tmp_path):
    ctx = multiprocessing.get_context("fork")  # children only touch files
    barrier = ctx.Barrier(3)
    log = tmp_path / "log"
    procs = [
        ctx.Process(target=_writer, args=(tmp_path / "c", "c0" * 32, log, barrier))
        for _ in range(3)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert log.read_text().count("built") == 1
    assert ArtifactCache(tmp_path / "c").get("c0" * 32) is not None


@pytest.mark.board
def test_corrupt_artifact_detected_and_rebuilt(cache_dir):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    with report.collect() as reps, torch.no_grad():
        ref = compile_bpu(model, executor="sim")(x)
    art = reps[0].runtimes[0].last_build.artifact
    data = bytearray((art.path / "model.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (art.path / "model.onnx").write_bytes(bytes(data))
    assert ArtifactCache(cache_dir).get(art.key) is None  # detected (and removed)
    torch._dynamo.reset()
    with report.collect() as reps, torch.no_grad():
        out = compile_bpu(model, executor="sim")(x)
    build = reps[0].runtimes[0].last_build
    assert build.exported and not build.cache_hit and torch.equal(out, ref)
    manifest = json.loads((art.path / "manifest.json").read_text())
    assert manifest["files"]["model.onnx"]["size"] == len(data)


@pytest.mark.board
def test_warm_cache_needs_no_export(monkeypatch):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        ref = compile_bpu(model, executor="sim")(x)
    torch._dynamo.reset()
    from torch_fl.bpu import build

    def no_export(*a, **k):
        raise AssertionError("exported despite a warm cache")

    monkeypatch.setattr(build, "export_weight_graph", no_export)
    with report.collect() as reps, torch.no_grad():
        out = compile_bpu(model, executor="sim")(x)
    assert reps[0].runtimes[0].last_build.cache_hit and torch.equal(out, ref)


def test_cache_clean(cache_dir):
    with torch.no_grad():
        compile_bpu(nn.Linear(4, 4).eval(), executor="sim")(torch.randn(1, 4))
    cache = ArtifactCache(cache_dir)
    assert len(cache.entries()) == 1
    assert cache.clean() == 1 and cache.entries() == []


@pytest.mark.parametrize("older", [3600.0])
def test_cache_clean_keeps_recent(cache_dir, older):
    with torch.no_grad():
        compile_bpu(nn.Linear(4, 4).eval(), executor="sim")(torch.randn(1, 4))
    assert ArtifactCache(cache_dir).clean(older_than_s=older) == 0

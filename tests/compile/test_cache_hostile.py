"""A cache directory with hostile or broken content, and disks that refuse writes.

Every malformed entry is discarded (never followed outside the cache, never run as another
graph's model) and rebuilt with a one-line warning; a cache that cannot be written raises one
error naming the path and the fix, with nothing half-written left behind."""

import errno
import json
import shutil
import tempfile
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.compile.bpu_helpers import compile_bpu
from torch_fl.bpu import report
from torch_fl.bpu.cache import ArtifactCache, CacheError
from torch_fl.bpu.errors import BpuError


def _model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()


X = torch.ones(1, 3, 8, 8)


def _run(model, **options):
    options.setdefault("executor", "sim")
    options.setdefault("calibrate", "none")  # the act_scale option must reach the artifact
    torch._dynamo.reset()
    with report.collect() as reps, torch.no_grad(), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = compile_bpu(model, **options)(X)
    cache_warnings = [str(x.message) for x in w if "cache" in str(x.message)]
    return out, reps[0].runtimes[0].last_build, cache_warnings


def _index_file(cache_dir, build):
    return Path(cache_dir) / "index" / f"{build.graph_key}.json"


def test_index_key_with_dotdot_never_touches_outside(cache_dir, tmp_path):
    model = _model(0)
    ref, build, _ = _run(model)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "manifest.json").write_text("{ not json")  # would be 'corrupt' -> deleted
    (victim / "precious.txt").write_text("keep me")
    rel = "../../victim"
    _index_file(cache_dir, build).write_text(json.dumps({"none": rel}))
    out, build2, warned = _run(model)
    assert (victim / "precious.txt").read_text() == "keep me"
    assert torch.equal(out, ref) and not build2.cache_hit
    assert len(warned) == 1 and "index" in warned[0]


def test_index_entry_pointing_at_another_graphs_artifact(cache_dir):
    model = _model(0)
    out_a, build_a, _ = _run(model, act_scale=0.5)  # other Q/DQ constants: another artifact
    out_b, build_b, _ = _run(model)
    assert not torch.equal(out_a, out_b)
    _index_file(cache_dir, build_b).write_text(json.dumps({"none": build_a.artifact.key}))
    out, build, warned = _run(model)
    assert torch.equal(out, out_b)  # not a's model
    assert len(warned) == 1 and "belongs to" in warned[0]


@pytest.mark.parametrize(
    "manifest",
    [
        "[1, 2, 3]",
        '{"files": null}',
        '{"files": {}}',
        '{"files": [1]}',
        '{"files": {"../../etc/passwd": {"sha256": "00", "size": 1}}}',
        '"just a string"',
    ],
)
def test_malformed_manifest_discarded_and_rebuilt(cache_dir, manifest):
    model = _model(0)
    ref, build, _ = _run(model)
    path = build.artifact.path / "manifest.json"
    path.write_text(manifest)
    out, build2, warned = _run(model)
    assert torch.equal(out, ref) and build2.exported
    assert len(warned) == 1 and str(build.artifact.path) in warned[0]
    assert len(warned[0].splitlines()) == 1
    json.loads((build2.artifact.path / "manifest.json").read_text())["files"]["model.onnx"]


@pytest.mark.parametrize("key", ["../x", "a" * 63, "g" * 64, "A" * 64 + "/..", ""])
def test_keys_must_be_hex_digests(cache_dir, key):
    cache = ArtifactCache(cache_dir)
    with pytest.raises(CacheError, match="not a sha256 hex digest"):
        cache.put(key, {"model.onnx": b"x"}, {})
    assert cache.get(key) is None  # a read with a bad key is a miss, touching nothing
    assert not (Path(cache_dir) / "x").exists()


def test_index_that_is_not_a_mapping_of_keys(cache_dir):
    model = _model(0)
    ref, build, _ = _run(model)
    _index_file(cache_dir, build).write_text('["not", "a", "dict"]')
    out, _, warned = _run(model)
    assert torch.equal(out, ref) and len(warned) == 1


def test_cache_path_is_a_regular_file(tmp_path):
    path = tmp_path / "cachefile"
    path.write_text("I am a file")
    with pytest.raises(Exception) as err:
        _run(_model(0), cache_dir=str(path))
    text = str(err.value)
    assert str(path) in text and "not a directory" in text and "cache_dir" in text
    assert ".trash" not in text and path.read_text() == "I am a file"


def test_enospc_names_path_and_leaves_nothing_half_written(cache_dir, monkeypatch):
    real_write = Path.write_bytes

    def full_disk(self, data):
        if "artifacts" in str(self):
            real_write(self, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, data)

    with monkeypatch.context() as patch:  # undone on exit; the fixture's env stays
        patch.setattr(Path, "write_bytes", full_disk)
        with pytest.raises(Exception) as err:
            _run(_model(0))
    text = str(err.value)
    assert str(cache_dir) in text and "No space left" in text and "Fix:" in text
    leftovers = [p for p in (Path(cache_dir) / "artifacts").rglob("*") if p.is_file()]
    assert leftovers == []
    ref, build, _ = _run(_model(0))  # space again: builds normally
    assert build.exported and str(build.artifact.path).startswith(str(cache_dir))


def test_read_only_cache_names_path_and_fix(cache_dir, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    with pytest.raises(Exception) as err:
        _run(_model(0))
    text = str(err.value)
    assert str(cache_dir) in text and "Read-only" in text and "'cache': False" in text
    assert len([ln for ln in text.splitlines() if "Read-only" in ln]) >= 1


def test_cache_error_is_a_bpu_error_and_an_oserror(tmp_path):
    path = tmp_path / "f"
    path.write_text("")
    with pytest.raises(CacheError) as err:
        ArtifactCache(path).put("a" * 64, {"model.onnx": b"x"}, {})
    assert isinstance(err.value, BpuError) and isinstance(err.value, OSError)
    shutil.rmtree(tmp_path / "nothing", ignore_errors=True)


def _get_within(cache, key, seconds=30.0):
    """cache.get(key) in a daemon thread: a read that blocks fails the test instead of hanging."""
    import threading

    result = {}
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        worker = threading.Thread(target=lambda: result.update(got=cache.get(key)), daemon=True)
        worker.start()
        worker.join(seconds)
    assert not worker.is_alive(), "the cache read blocked"
    return result["got"], [str(x.message) for x in w]


@pytest.mark.parametrize("kind", ["dev_zero", "fifo_manifest", "link_outside", "entry_is_link"])
def test_special_files_and_links_in_an_entry_are_discarded(tmp_path, kind):
    """A FIFO or a link to /dev/zero would block every compile; a link reads outside the cache."""
    import hashlib
    import os

    cache = ArtifactCache(tmp_path / "cache")
    key = "a" * 64
    entry = cache.put(key, {"model.onnx": b"graph"}, {"march": "nash-e"}).path
    outside = tmp_path / "outside"
    outside.mkdir()
    if kind == "dev_zero":  # stat says 0 bytes; reading never ends
        manifest = json.loads((entry / "manifest.json").read_text())
        manifest["files"]["model.onnx"] = {"sha256": hashlib.sha256(b"").hexdigest(), "size": 0}
        (entry / "manifest.json").write_text(json.dumps(manifest))
        (entry / "model.onnx").unlink()
        (entry / "model.onnx").symlink_to("/dev/zero")
    elif kind == "fifo_manifest":
        (entry / "manifest.json").unlink()
        os.mkfifo(entry / "manifest.json")
    elif kind == "link_outside":
        (outside / "model.onnx").write_bytes(b"graph")
        (entry / "model.onnx").unlink()
        (entry / "model.onnx").symlink_to(outside / "model.onnx")
    else:
        shutil.move(entry, outside / "entry")
        entry.symlink_to(outside / "entry")
    got, messages = _get_within(cache, key)
    assert got is None and any("discarded" in m for m in messages), messages
    assert not os.path.lexists(entry)
    assert sorted(p.name for p in outside.iterdir()) == (
        ["model.onnx"] if kind == "link_outside" else ["entry"] if kind == "entry_is_link" else []
    )  # nothing outside the cache was removed


def test_index_file_that_is_a_fifo_is_ignored(tmp_path):
    import os
    import threading

    cache = ArtifactCache(tmp_path / "cache")
    (tmp_path / "cache" / "index").mkdir(parents=True)
    os.mkfifo(tmp_path / "cache" / "index" / f"{'b' * 64}.json")
    result = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        worker = threading.Thread(
            target=lambda: result.update(got=cache.index_lookup("b" * 64)), daemon=True
        )
        worker.start()
        worker.join(30)
    assert not worker.is_alive(), "the index read blocked"
    assert result["got"] == {}

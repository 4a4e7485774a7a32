"""The bpu backend's single-file writes (calibration JSON, cache index) are atomic."""

from __future__ import annotations

import os

import pytest

from torch_fl.bpu.cache import ArtifactCache
from torch_fl.bpu.conversion.calibration import Calibration


def _failing_replace(monkeypatch):
    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)


def test_failed_calibration_save_keeps_old_file_and_leaves_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "calib.json"
    Calibration({"fp": {"x": 0.5}}).save(path)
    before = path.read_bytes()
    _failing_replace(monkeypatch)
    with pytest.raises(OSError):
        Calibration({"fp": {"x": 0.25}}).save(path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calib.json"]
    assert Calibration.load(path).scales == {"fp": {"x": 0.5}}


def test_failed_index_write_leaves_no_temp(tmp_path, monkeypatch):
    cache = ArtifactCache(tmp_path / "cache")
    gkey, key = "a" * 64, "b" * 64
    cache.index_record(gkey, "none", key)
    _failing_replace(monkeypatch)
    with pytest.raises(OSError):
        cache.index_record(gkey, "other", key)
    monkeypatch.undo()
    assert cache.index_lookup(gkey) == {"none": key}
    assert [p.name for p in (tmp_path / "cache" / "index").iterdir()] == [f"{gkey}.json"]

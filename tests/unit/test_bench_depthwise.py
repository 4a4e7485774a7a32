"""scripts/bench_depthwise.py: the op against ORT's QLinearConv per public conv shape."""

from __future__ import annotations

import json

import pytest

from scripts import bench_depthwise
from torch_fl.bpu.conversion.depthwise import ALIGNED_CHANNELS


def test_rows_time_both_and_check_the_bytes(tmp_path, capsys):
    out = tmp_path / "dw.json"
    assert bench_depthwise.main(["--iters", "10", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert len(doc["rows"]) == len(bench_depthwise.SHAPES)
    assert doc["form"] in ("avx512", "avx2", "portable") and doc["cpu_kind"] == "native"
    for row in doc["rows"]:
        assert row["equal"] is True
        assert row["ort_us"] > 0 and row["op_us"] > 0
        assert row["ort_over_op"] == pytest.approx(row["ort_us"] / row["op_us"], rel=0.01)
        assert row["moved"] == (row["channels"] % ALIGNED_CHANNELS != 0)
    assert "geometric mean ORT / op" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["dw.json"]  # no temporary left


def test_too_few_iterations_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        bench_depthwise.main(["--iters", "5"])
    assert exc.value.code == 2
    assert "--iters must be at least 10" in capsys.readouterr().err

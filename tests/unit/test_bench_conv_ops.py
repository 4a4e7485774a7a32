"""scripts/bench_conv_ops.py: the conv ops against ORT's QLinearConv per public conv shape."""

from __future__ import annotations

import json

import pytest

from scripts import bench_conv_ops
from torch_fl.bpu.conversion.depthwise import ALIGNED_CHANNELS
from torch_fl.bpu.conversion.narrow_op import MAX_OUTPUTS_BY_FORM
from torch_fl.bpu.runtime import sim_kernels
from torch_fl.bpu.runtime.executors import takes_pair_gemms


def test_rows_time_both_and_check_the_bytes(tmp_path, capsys):
    out = tmp_path / "ops.json"
    assert bench_conv_ops.main(["--iters", "10", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    keys = {
        "gemm": ("rows", "k", "n"),
        "pointwise": ("batch", "size", "channels", "outputs"),
        "depthwise": ("batch", "size", "channels", "kernel", "stride"),
        "narrow": ("batch", "size", "channels", "kernel", "stride"),
    }
    assert [(r["op"], *(r[k] for k in keys[r["op"]])) for r in doc["rows"]] == [
        (op, *shape) for op, shape in bench_conv_ops.SHAPES
    ]
    assert doc["forms"]["depthwise"] in ("avx512", "avx2", "portable")
    assert doc["forms"]["pointwise"] == doc["forms"]["gemm"] in ("avx2", "portable")
    assert doc["cpu_kind"] == "native"
    pairs_move = takes_pair_gemms(sim_kernels.choose("auto").path)
    for row in doc["rows"]:
        assert row["equal"] is True
        assert row["ort_us"] > 0 and row["op_us"] > 0
        assert row["ort_over_op"] == pytest.approx(row["ort_us"] / row["op_us"], rel=0.01)
        form = doc["forms"][row["op"]]
        if row["op"] in bench_conv_ops.PAIRS:
            # ORT's u8s8 kernel on the same integers, timed beside them
            assert row["u8s8_us"] > 0
            assert row["u8s8_over_op"] == pytest.approx(row["u8s8_us"] / row["op_us"], rel=0.01)
            assert row["moved"] == pairs_move
            continue
        assert "u8s8_us" not in row
        if row["op"] == "depthwise":
            unaligned = row["channels"] % ALIGNED_CHANNELS != 0
            assert row["moved"] == (form != "portable" and unaligned)
        else:
            assert row["moved"] == (row["channels"] <= MAX_OUTPUTS_BY_FORM.get(form, 0))
    assert "depthwise: 6 moved, geometric mean ORT / op" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["ops.json"]  # no temporary left


def test_too_few_iterations_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        bench_conv_ops.main(["--iters", "5"])
    assert exc.value.code == 2
    assert "--iters must be at least 10" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["a directory", "under a file"])
def test_an_unwritable_json_path_is_refused_before_any_timing(tmp_path, capsys, where):
    (tmp_path / "file").write_text("x")
    path = tmp_path if where == "a directory" else tmp_path / "file" / "ops.json"
    with pytest.raises(SystemExit) as exc:
        bench_conv_ops.main(["--iters", "10", "--json", str(path)])
    assert exc.value.code == 2
    err = capsys.readouterr()
    assert f"--json '{path}'" in err.err and "the ops' forms" not in err.out


def test_ctrl_c_exits_130_with_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_conv_ops, "measure", interrupted)
    out = tmp_path / "ops.json"
    assert bench_conv_ops.main(["--iters", "10", "--json", str(out)]) == 130
    assert capsys.readouterr().err.strip() == "bench_conv_ops: interrupted"
    assert list(tmp_path.iterdir()) == []

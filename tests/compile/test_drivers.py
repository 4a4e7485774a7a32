"""Compiler drivers against the hbdk4 stand-in (tests/standins/hbdk4)."""

import json
import os
import stat
import subprocess
import sys
import tempfile

import onnx
import pytest
import torch
from torch import nn

from tests.compile.bpu_helpers import STANDINS, compile_bpu
from torch_fl.bpu import drivers, report
from torch_fl.bpu.drivers import CompileError, compile_onnx, discover


def _script(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.fixture(scope="module")
def libhbtl(tmp_path_factory):
    d = tmp_path_factory.mktemp("guest")
    src = d / "hbtl.c"
    src.write_text("int hbtl_standin_symbol(void) { return 42; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(d / "libhbtl.so"), str(src)], check=True)
    return d


@pytest.fixture
def x86(tmp_path, monkeypatch, libhbtl):
    """An 'x86_64 Python with hbdk4': the venv Python with the stand-in on its path."""
    record = tmp_path / "record.json"

    def make(fail="", emulated=False):
        py = _script(
            tmp_path / "x86python",
            "#!/bin/sh\n"
            'export STANDIN_OUTER_PYTHONPATH="${PYTHONPATH-<unset>}"\n'
            f"export PYTHONPATH={STANDINS / 'hbdk4'}\n"
            f"export HBDK4_STANDIN_FAIL={fail}\n"
            "export HBDK4_STANDIN_LIBHBTL_SYMBOL=hbtl_standin_symbol\n"
            f"export HBDK4_STANDIN_RECORD={record}\n"
            f'exec {sys.executable} "$@"\n',
        )
        monkeypatch.setenv("FLAGOS_BPU_X86_PYTHON", py)
        monkeypatch.setenv("FLAGOS_BPU_GUEST_LIBS", str(libhbtl))
        monkeypatch.setenv("PYTHONPATH", "/host/leak")
        if emulated:
            emu = _script(tmp_path / "box64", '#!/bin/sh\nexec "$@"\n')
            monkeypatch.setenv("FLAGOS_BPU_EMULATOR", emu)
            monkeypatch.setenv("FLAGOS_BPU_DRIVER", "emulated")
        else:
            monkeypatch.setenv("FLAGOS_BPU_DRIVER", "native")
        return discover(refresh=True)

    make.record = record
    return make


def _onnx_bytes():
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
    )
    return onnx.helper.make_model(graph).SerializeToString()


def test_discover_none_and_cached(monkeypatch):
    info = discover(refresh=True)
    assert info.kind == "none" and "FLAGOS_BPU_DRIVER=none" in info.detail
    monkeypatch.setenv("FLAGOS_BPU_DRIVER", "auto")
    monkeypatch.delenv("FLAGOS_BPU_X86_PYTHON", raising=False)
    first = discover(refresh=True)
    assert first.kind == "none" and discover() is first  # cached per configuration


def test_emulated_compile_clean_env_shims_and_preload(x86):
    info = x86(emulated=True)
    assert (info.kind, info.version) == ("emulated", "unknown") or info.kind == "emulated"
    hbm, result = compile_onnx(_onnx_bytes(), info, "nash-e", 2, 60)
    hbm2, _ = compile_onnx(_onnx_bytes(), info, "nash-e", 2, 60)
    assert hbm == hbm2 and hbm.startswith(b"HBM-STANDIN\n")  # deterministic artifact
    assert result["preloaded"].endswith("libhbtl.so")
    seen = json.loads(x86.record.read_text())
    assert seen["pythonpath_seen"] == "<unset>"  # host PYTHONPATH did not leak
    assert seen["torch"].endswith("torch-fl-shim") and seen["numba"].endswith("torch-fl-shim")
    assert seen["box64_ld_library_path"] == os.environ["FLAGOS_BPU_GUEST_LIBS"]


@pytest.mark.parametrize(
    "fail,stage",
    [("import", "import"), ("compile", "compile"), ("symbol", "import")],
)
def test_failure_modes_named(x86, fail, stage, monkeypatch):
    info = x86(fail=fail, emulated=True)
    with pytest.raises(CompileError, match=f"stage '{stage}'") as err:
        compile_onnx(_onnx_bytes(), info, "nash-e", 2, 60)
    assert "Fix:" in str(err.value)


def test_missing_libhbtl_preload_is_reported(x86, monkeypatch, tmp_path):
    info = x86(emulated=True)
    monkeypatch.setenv("FLAGOS_BPU_GUEST_LIBS", str(tmp_path))  # no libhbtl.so there
    info = discover(refresh=True)
    with pytest.raises(CompileError, match="undefined symbol.*FLAGOS_BPU_GUEST_LIBS"):
        compile_onnx(_onnx_bytes(), info, "nash-e", 2, 60)


def test_validation_failure_after_complete_artifact_tolerated(x86):
    info = x86(fail="validate", emulated=True)
    hbm, result = compile_onnx(_onnx_bytes(), info, "nash-e", 2, 60)
    assert hbm.startswith(b"HBM-STANDIN") and "validation" in result["tolerated"]


def test_timeout_kills_compiler(x86):
    info = x86(fail="timeout", emulated=True)
    with pytest.raises(CompileError, match="timed out"):
        compile_onnx(_onnx_bytes(), info, "nash-e", 2, 3)


def test_hbm_executor_end_to_end(x86, monkeypatch, request):
    x86(emulated=True)
    monkeypatch.syspath_prepend(str(STANDINS / "hbm_runtime"))
    import hbm_runtime

    # later tests must see a host without a board again
    request.addfinalizer(lambda: sys.modules.pop("hbm_runtime", None))

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        sim = compile_bpu(model, executor="sim")(x)
        torch._dynamo.reset()
        with report.collect() as reps:
            out = compile_bpu(model, executor="hbm")(x)
    rt = reps[0].runtimes[0]
    assert rt.kind == "hbm" and rt.last_build.compiled
    # same Q/DQ numerics; ORT picks other float kernels for constant weights (last-ulp sums)
    assert torch.allclose(out, sim, rtol=1e-5, atol=1e-6)
    assert hbm_runtime.CALLS[-1][rt.spec.input_names[0]] == x.data_ptr()  # zero-copy input
    # a fresh compile on a "board" without compiler finds the shipped artifact by graph key
    monkeypatch.setenv("FLAGOS_BPU_DRIVER", "none")
    drivers.discover(refresh=True)
    torch._dynamo.reset()
    with report.collect() as reps, torch.no_grad():
        again = compile_bpu(model, executor="hbm")(x)
    assert reps[0].runtimes[0].last_build.cache_hit and torch.equal(again, out)


@pytest.mark.parametrize("executor", ["sim", "eager"])
def test_uncached_artifact_leaves_no_temporary_dir(x86, monkeypatch, tmp_path, executor):
    """compile_artifact='always' without a cache compiles an .hbm that sim and eager never read:
    it must not stay behind in the temporary directory."""
    x86(emulated=True)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    with report.collect() as reps, torch.no_grad():
        compile_bpu(model, executor=executor, compile_artifact="always", cache=False)(x)
    assert reps[0].runtimes[0].last_build.compiled
    assert not list(scratch.glob("torch-fl-bpu-*")), "uncached .hbm left behind"


def test_long_compile_prints_a_heartbeat(x86, monkeypatch, capfd):
    """A compile that runs for a while says so on stderr, with its elapsed time."""
    info = x86(fail="timeout", emulated=True)
    monkeypatch.setenv("TORCH_FL_HEARTBEAT_S", "0.5")
    with pytest.raises(CompileError, match="timed out"):
        compile_onnx(_onnx_bytes(), info, "nash-e", 2, 3)
    err = capfd.readouterr().err
    assert "[hbdk4 compile (emulated, nash-e)]" in err and "elapsed" in err

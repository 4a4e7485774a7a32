"""The env file: provisioning writes and compares it with torch_fl's own reader."""

from __future__ import annotations

import pytest

from provision import config, plan
from provision.context import Context, Options
from provision.floor import light
from provision.results import NEEDED, OK, Inputs, X86PythonFound
from provision.steps.envfile import STEP
from provision.target import LocalTarget

envfile = light.load("envfile")


@pytest.mark.parametrize(
    "value", ["/plain/path", "/with space/x", " padded ", "'quoted'", '"dq"', "a=b#c", ""]
)
def test_render_reads_back_exactly(value):
    values = {"FLAGOS_BPU_CACHE": value, "FLAGOS_BPU_MARCH": "nash-e"}
    assert envfile.parse_env_text(envfile.render_env_text(values)) == values


@pytest.mark.parametrize(("key", "value"), [("BAD KEY", "x"), ("A", "two\nlines"), ("A", "c\r")])
def test_render_refuses_what_cannot_be_read_back(key, value):
    with pytest.raises(ValueError, match="one KEY=VALUE a line"):
        envfile.render_env_text({key: value})


def _ctx(tmp_path):
    facts = {"arch": "x86_64", "board_model": "", "env_file": str(tmp_path / "env")}
    return Context(
        LocalTarget(), facts, config.load(), Options(), tmp_path, tmp_path, echo=lambda m: None
    )


def test_file_torch_fl_would_refuse_is_rewritten(tmp_path):
    ctx = _ctx(tmp_path)
    inputs = Inputs(x86_python=X86PythonFound("/opt/x86/python3", "", False))
    res = plan._check(STEP, ctx, inputs)
    assert res.status == NEEDED
    STEP.apply(ctx, res, inputs)
    assert plan._check(STEP, ctx, inputs).status == OK
    path = tmp_path / "env"
    # Every wanted value present, plus a line torch_fl's reader rejects: not up to date.
    path.write_text(path.read_text() + "this line is not KEY=VALUE\n")
    with pytest.raises(ValueError):
        envfile.load_env_file(path)
    res = plan._check(STEP, ctx, inputs)
    assert res.status == NEEDED and "cannot read" in res.detail
    STEP.apply(ctx, res, inputs)
    assert envfile.load_env_file(path)["FLAGOS_BPU_X86_PYTHON"] == "/opt/x86/python3"
    assert plan._check(STEP, ctx, inputs).status == OK

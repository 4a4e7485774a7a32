"""scripts/bench_sim.py's networks: its four, and any public one named `tv:<torchvision name>`
or `timm:<name>` (built with random weights, its batch norms settled); a name that is neither
is refused before anything is timed, with the forms it takes."""

from __future__ import annotations

import pytest
import torch

from scripts import bench_sim
from tests.support.public_zoo import available


def test_a_name_that_is_no_network_is_refused_with_the_forms_it_takes(capsys):
    for models in ("resnet", "tv:no_such_network", "timm:no_such_network", "keras:resnet50",
                   "tv:", "tv:_api", "tv:get_model", "tv:list_models"):  # fmt: skip
        with pytest.raises(SystemExit) as stop:
            bench_sim.main(["--models", models, "--json", ""])
        assert stop.value.code == 2, models
        err = capsys.readouterr().err
        assert "unknown model(s)" in err and "tv:<torchvision model>" in err, models
    with pytest.raises(ValueError, match="tv:<torchvision name> or timm:<name>"):
        bench_sim.public_model("keras:resnet50")


@pytest.mark.skipif(not available("torchvision"), reason="torchvision is not installed")
def test_a_torchvision_network_by_name_is_built_with_settled_batch_norms():
    model, x = bench_sim.build("tv:regnet_y_400mf", 2)
    assert type(model).__name__ == "RegNet" and not model.training
    assert tuple(x.shape) == (2, 3, 224, 224)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    # measured statistics, not the initial mean 0 / variance 1
    assert norms and not torch.allclose(norms[3].running_var, torch.ones_like(norms[3].running_var))
    again, _ = bench_sim.build("tv:regnet_y_400mf", 1)  # seeded: the same weights
    first = next(model.parameters())
    assert torch.equal(first, next(again.parameters()))


@pytest.mark.skipif(
    not (available("torchvision") and available("timm")), reason="timm or torchvision missing"
)
def test_a_timm_name_checked_first_in_a_fresh_process_does_not_crash_on_torchvision():
    # timm imports torchvision, whose own import fails on its C ops' fake registrations: the
    # check of a timm name must import torchvision the safe way first (a run whose first name
    # checked was a timm one crashed before)
    import subprocess
    import sys
    from pathlib import Path

    root = Path(bench_sim.__file__).resolve().parents[1]
    code = (
        "from scripts import bench_sim\n"
        "print(bench_sim._public_maker('timm:resnet18') is not None,"
        " bench_sim._public_maker('timm:no_such_network') is None)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["True", "True"]

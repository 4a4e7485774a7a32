"""Zero-size inputs (an empty batch) run, with every executor, in a child process: the failure
this guards against was a SIGFPE that killed the whole interpreter."""

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import torch
    import torch_fl.bpu
    from torch_fl.bpu import report

    def fn(x):
        return torch.flatten(torch.relu(x), 1)

    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    for model, shape in ((fn, (0, 3, 4, 4)), (conv, (0, 3, 8, 8)), (fn, (2, 0, 4, 4))):
        x = torch.randn(*shape)
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="bpu", options={"executor": "{executor}"},
                                 dynamic=False)
        with report.collect() as reps, torch.no_grad():
            out = compiled(x)
            ref = model(x)
        assert out.shape == ref.shape, (out.shape, ref.shape)
        kinds = [rt.kind for g in reps for rt in g.runtimes]
        print("OK", shape, kinds)
    """
)


@pytest.mark.parametrize("executor", ["sim", "eager"])
def test_empty_batch_runs(executor, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT.replace("{executor}", executor)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("OK") == 3
    assert "zero-size" not in proc.stdout  # the reason is recorded, not printed

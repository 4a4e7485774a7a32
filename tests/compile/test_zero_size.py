"""Zero-size inputs (an empty batch) run, with every executor, in a child process: the failure
this guards against was a SIGFPE that killed the whole interpreter."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import torch
    import torch_fl.bpu
    from torch_fl.bpu import report

    def fn(x):
        return torch.flatten(torch.relu(x), 1)

    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    cases = ((fn, (0, 3, 4, 4)), (conv, (0, 3, 8, 8)), (fn, (2, 0, 4, 4)))
    for executor, (model, shape) in [(e, c) for e in ("sim", "eager") for c in cases]:
        x = torch.randn(*shape)
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="bpu", options={"executor": executor},
                                 dynamic=False)
        with report.collect() as reps, torch.no_grad():
            out = compiled(x)
            ref = model(x)
        assert out.shape == ref.shape, (out.shape, ref.shape)
        kinds = [rt.kind for g in reps for rt in g.runtimes]
        print("OK", executor, shape, kinds)
    """
)


def test_empty_batch_runs():
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("OK") == 6
    # the empty partitions of the sim executor ran eagerly (ORT would divide by zero)
    assert "OK sim (0, 3, 8, 8) ['eager']" in proc.stdout, proc.stdout

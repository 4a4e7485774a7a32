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


CALIBRATE = textwrap.dedent(
    """
    import torch
    import torch_fl.bpu as bpu
    from torch_fl.bpu import report

    class Detector(torch.nn.Module):
        # like torchvision's detection heads: a data-dependent selection (a graph break)
        # leaves a later partition with 0 x 4 inputs on most images
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Conv2d(3, 4, 3)
            self.head = torch.nn.Linear(4, 4)

        def forward(self, x):
            feats = torch.relu(self.body(x)).flatten(2).mean(-1)
            keep = feats[feats.sum(1) > 1e9]  # nothing is kept
            return feats, self.head(keep) * 2

    model = Detector().eval()
    compiled = torch.compile(model, backend="bpu", options={"executor": "sim"})
    samples = [torch.randn(1, 3, 8, 8) for _ in range(3)]
    with torch.no_grad():
        bpu.calibrate(compiled, samples)
        with report.ran() as seen:
            feats, boxes = compiled(samples[0])
    assert boxes.shape == (0, 4), boxes.shape
    kinds = sorted(p.executor for g in seen for p in g.partitions)
    print("OK", kinds)
    """
)


def test_calibration_with_zero_size_partitions():
    proc = subprocess.run(
        [sys.executable, "-c", CALIBRATE], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "OK" in proc.stdout and "'sim'" in proc.stdout and "'eager'" in proc.stdout, proc.stdout

"""Every zoo architecture: exact with the eager executor, >= 98% coverage in <= 2 partitions,
every partition exports (sim), and calibrated sim cosine >= 0.999 against fp32."""

import warnings

import pytest
import torch

import torch_fl.bpu as bpu
from tests.compile.bpu_helpers import compile_bpu, cosine
from tests.support.zoo import ZOO, build
from torch_fl.bpu import report


@pytest.fixture(autouse=True)
def trace_rnns():
    # Dynamo stops tracing at nn.GRU/LSTM unless told otherwise (the rest of the frame would run
    # eagerly, outside every graph); the docs tell users the same
    with torch._dynamo.config.patch(allow_rnn=True):
        yield


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_model(name):
    model, x = build(name)
    with torch.no_grad():
        assert report.graph_breaks(model, x) == []  # nothing runs outside the compiled graphs
    torch._dynamo.reset()
    with torch.no_grad():
        ref = model(x)

    with report.collect() as reps, torch.no_grad():
        out = compile_bpu(model, executor="eager")(x)
    rep = report.Report(list(reps))
    # the fused kernels (attention, upsampling) are replaced by the ops they compute: not
    # bit-identical to the fused kernel, identical to the float math
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert rep.coverage_pct >= 98.0, rep.table()
    assert 1 <= len(rep.partitions) <= 2, rep.table()

    torch._dynamo.reset()
    generator = torch.Generator().manual_seed(3)
    samples = [torch.randn(x.shape, generator=generator) for _ in range(4)]
    with report.collect() as reps:
        sim = compile_bpu(model, executor="sim")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            bpu.calibrate(sim, samples)
        with torch.no_grad():
            calibrated = sim(x)
    runtimes = [r for g in reps for r in g.runtimes]
    # every partition exported and runs int8 Q/DQ (a failed export would fall back to eager)
    assert runtimes and all(r.kind == "sim" and r.builds == 1 for r in runtimes)
    assert cosine(calibrated, ref) >= 0.999

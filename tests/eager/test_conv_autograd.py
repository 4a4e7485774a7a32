"""Convolution (explicit kernels) and autograd through the fallback, against the CPU."""

import pytest
import torch

from tests.eager.parity import assert_parity, on_device


@pytest.mark.board
def test_conv2d_forward_and_backward():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 12, 12, generator=g, requires_grad=True)
    w = torch.randn(5, 3, 3, 3, generator=g, requires_grad=True)
    b = torch.randn(5, generator=g, requires_grad=True)
    xd, wd, bd = (on_device(t.detach()).requires_grad_() for t in (x, w, b))
    ref = torch.nn.functional.conv2d(x, w, b, stride=2, padding=1)
    got = torch.nn.functional.conv2d(xd, wd, bd, stride=2, padding=1)
    assert_parity(got, ref.detach())
    grad = torch.randn(ref.shape, generator=g)
    ref.backward(grad)
    got.backward(on_device(grad))
    for dev_t, cpu_t in ((xd, x), (wd, w), (bd, b)):
        assert dev_t.grad is not None and dev_t.grad.device.type == "flagos"
        torch.testing.assert_close(dev_t.grad.cpu(), cpu_t.grad)


def test_grouped_and_transposed_conv():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 4, 9, 9, generator=g)
    dw = torch.randn(4, 1, 3, 3, generator=g)
    assert_parity(
        torch.nn.functional.conv2d(on_device(x), on_device(dw), groups=4),
        torch.nn.functional.conv2d(x, dw, groups=4),
    )
    wt = torch.randn(4, 2, 3, 3, generator=g)
    assert_parity(
        torch.nn.functional.conv_transpose2d(on_device(x), on_device(wt), stride=2),
        torch.nn.functional.conv_transpose2d(x, wt, stride=2),
    )


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, stride=2)
        self.fc = torch.nn.Linear(8 * 7 * 7, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv1(x)))
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv2(x)), 1)
        return self.fc(x.flatten(1))


def test_sgd_step_matches_cpu():
    torch.manual_seed(0)
    cpu_model = SmallCNN()
    dev_model = SmallCNN()
    dev_model.load_state_dict(cpu_model.state_dict())
    dev_model = dev_model.to("flagos")
    assert all(p.device.type == "flagos" for p in dev_model.parameters())
    x = torch.randn(4, 3, 16, 16)
    target = torch.randint(0, 10, (4,))
    for model, inp, tgt in ((cpu_model, x, target), (dev_model, on_device(x), on_device(target))):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for _ in range(2):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(inp), tgt)
            loss.backward()
            opt.step()
    for (name, p_cpu), p_dev in zip(
        cpu_model.state_dict().items(), dev_model.state_dict().values(), strict=True
    ):
        assert p_dev.device.type == "flagos", name
        torch.testing.assert_close(p_dev.cpu(), p_cpu, msg=name)

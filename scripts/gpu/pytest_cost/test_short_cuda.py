# The CI cost of `cupool check -- pytest` (scripts/gpu-cost.sh): a suite of
# short, clean CUDA tests, the shape of a library's GPU test suite.
import pytest
import torch


@pytest.mark.parametrize("n", [64, 128, 256, 512, 1024])
def test_matmul(n):
    a = torch.randn(n, n, device="cuda")
    assert torch.allclose(a @ torch.eye(n, device="cuda"), a)


@pytest.mark.parametrize("size", [1 << 10, 1 << 16, 1 << 20, 1 << 24])
def test_sum(size):
    assert torch.ones(size, device="cuda").sum().item() == size


@pytest.mark.parametrize("channels", [3, 8, 16, 32])
def test_conv(channels):
    conv = torch.nn.Conv2d(channels, 16, 3).cuda()
    assert conv(torch.randn(4, channels, 64, 64, device="cuda")).shape == (4, 16, 62, 62)


@pytest.mark.parametrize("steps", [1, 5, 20])
def test_train_steps(steps):
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), 0.1)
    for _ in range(steps):
        loss = model(torch.randn(64, 256, device="cuda")).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert torch.isfinite(loss)


def test_copy_roundtrip():
    host = torch.arange(1 << 20, dtype=torch.float32)
    assert torch.equal(host.cuda().cpu(), host)

# GPU check of `cupool check -- pytest`: four CUDA tests, one of which
# leaks (keeps a tensor in a module-level list); the others are clean.
import torch

_kept = []


def test_matmul():
    a = torch.randn(1024, 1024, device="cuda")
    assert (a @ a).shape == (1024, 1024)


def test_leaks_a_buffer():
    _kept.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))


def test_sum():
    assert torch.ones(1 << 20, device="cuda").sum().item() == 1 << 20


def test_conv():
    conv = torch.nn.Conv2d(3, 16, 3).cuda()
    assert conv(torch.randn(8, 3, 64, 64, device="cuda")).shape == (8, 16, 62, 62)

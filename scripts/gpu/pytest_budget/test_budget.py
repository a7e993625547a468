# GPU check of memory budgets under `cupool check -- pytest`: one test
# within its limit, one past it (its peak of tensors, PyTorch's cache not
# counted); nothing leaks.
import pytest
import torch

MIB = 1 << 20


@pytest.mark.cupool_limit_memory("256 MiB")
def test_within_its_limit():
    a = torch.empty(64 * MIB, dtype=torch.uint8, device="cuda")
    assert a.numel() == 64 * MIB


@pytest.mark.cupool_limit_memory("256 MiB")
def test_past_its_limit():
    a = torch.empty(512 * MIB, dtype=torch.uint8, device="cuda")
    assert a.numel() == 512 * MIB

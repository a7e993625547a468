import torch
def test_cpu_tensor():
    assert torch.ones(3).sum().item() == 3

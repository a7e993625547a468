import pytest, torch

KEEP = []

@pytest.fixture(scope="session")
def model():
    return torch.nn.Linear(1024, 1024).cuda()

@pytest.fixture
def batch():
    return torch.randn(256, 1024, device="cuda")

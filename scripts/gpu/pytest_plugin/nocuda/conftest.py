import torch
def pytest_sessionfinish(session):
    print("\nCUDA_INITIALISED=%s" % torch.cuda.is_initialized())

# GPU check of allocation sites (scripts/gpu-sites.sh): a planted 512 MiB
# tensor on the line marked PLANTED among a small model's allocations.
import torch

model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).cuda()
for _ in range(3):
    model(torch.randn(64, 256, device="cuda")).sum().backward()


def planted():
    return torch.empty(512 << 20, dtype=torch.uint8, device="cuda")  # PLANTED


big = planted()
big.fill_(1)
torch.cuda.synchronize()
print("result: ok")

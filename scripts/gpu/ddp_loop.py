# GPU check of `cupool check` under torchrun (scripts/gpu-leakcheck.sh): a
# two-rank DDP job, gloo backend, both ranks on GPU 0. LEAK=1 keeps every
# step's output alive (the line marked LEAK).
import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
leak = os.environ.get("LEAK") == "1"
model = DDP(torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096)).cuda())
opt = torch.optim.SGD(model.parameters(), 1e-3)
kept = []
for step in range(200):
    out = model(torch.randn(512, 1024, device="cuda"))  # ALLOCATED
    out.float().pow(2).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if leak:
        kept.append(out.detach())  # LEAK
torch.cuda.synchronize()
dist.destroy_process_group()
print(f"result: ok rank={rank}")

# A two-rank DDP job with NCCL, one GPU per rank (scripts/gpu-multi.sh); with
# BACKEND=gloo, both ranks on GPU 0 (what a one-GPU machine can run).
# Prints every rank's loss bits (runs must agree exactly) and ms/iter.
# LEAK_RANK=R keeps every step's output alive on rank R only (the line
# marked ALLOCATED is where it is allocated).
import os
import time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

backend = os.environ.get("BACKEND", "nccl")
dist.init_process_group(backend)
rank = dist.get_rank()
torch.cuda.set_device(rank if backend == "nccl" else 0)
torch.manual_seed(0)
leak = os.environ.get("LEAK_RANK") == str(rank)
steps = int(os.environ.get("STEPS", "120"))
warmup = min(20, steps // 2)  # timed from here
model = DDP(torch.nn.Sequential(torch.nn.Linear(2048, 8192), torch.nn.ReLU(), torch.nn.Linear(8192, 2048)).cuda())
opt = torch.optim.SGD(model.parameters(), 1e-3)
gen = torch.Generator(device="cuda").manual_seed(rank)
kept, total = [], torch.zeros((), device="cuda", dtype=torch.float64)
for step in range(steps):
    if step == warmup:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
    out = model(torch.randn(1024, 2048, device="cuda", generator=gen))  # ALLOCATED
    loss = out.float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    total += loss.detach().double()
    if leak:
        kept.append(out.detach())
torch.cuda.synchronize()
ms = (time.perf_counter() - t0) * 1000 / (steps - warmup)
bits = total.item()
dist.destroy_process_group()
print(f"result: rank={rank} loss_sum={bits.hex()} last={loss.item():.6f} ms_iter={ms:.3f}", flush=True)

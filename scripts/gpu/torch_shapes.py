# GPU check of `cupool check` on training loops the rules were not built
# around. SHAPE: compile (torch.compile'd model), graphs (compiled with
# mode="reduce-overhead": CUDA graphs, a pool of their own, and a new
# graph for the smaller last batch), amp (autocast, GradScaler,
# a convolution net with cudnn.benchmark), eval (an evaluation pass every
# fifth step, a smaller last batch), empty (torch.cuda.empty_cache() every
# step), loader (a DataLoader with two workers and pinned memory). Clean,
# each must pass; LEAK=1 keeps every step's output for later (the line
# marked ALLOCATED), where the leak is to be found.
import os
import torch
import torch.nn as nn
import torch.nn.functional as F

shape = os.environ.get("SHAPE", "compile")
leak = os.environ.get("LEAK") == "1"
torch.manual_seed(0)
if shape == "amp":
    torch.backends.cudnn.benchmark = True
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(512, 10)).cuda()
    make = lambda n: (torch.randn(n, 3, 32, 32, device="cuda"), torch.randn(n, 10, device="cuda"))
else:
    model = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 10)).cuda()
    make = lambda n: (torch.randn(n, 512, device="cuda"), torch.randn(n, 10, device="cuda"))
if shape == "compile":
    run = torch.compile(model)
elif shape == "graphs":
    run = torch.compile(model, mode="reduce-overhead")
else:
    run = model
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cuda", enabled=shape == "amp")


def batches(steps):
    if shape == "loader":
        data = torch.utils.data.TensorDataset(torch.randn(steps * 64, 512), torch.randn(steps * 64, 10))
        for x, y in torch.utils.data.DataLoader(data, batch_size=64, num_workers=2, pin_memory=True):
            yield x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    else:
        for i in range(steps):
            yield make(37 if (shape in ("eval", "graphs") and i == steps - 1) else 64)


total, kept = 0.0, []
for step, (x, y) in enumerate(batches(40)):
    with torch.autocast("cuda", dtype=torch.float16, enabled=shape == "amp"):
        out = run(x)  # ALLOCATED
        loss = F.mse_loss(out, y)
    if leak:
        kept.append(out.detach())
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    total += loss.item()
    if shape == "eval" and step % 5 == 4:
        with torch.no_grad():
            run(make(256)[0]).sum().item()
    if shape == "empty":
        torch.cuda.empty_cache()
torch.cuda.synchronize()
print(f"result: ok {total > 0}")

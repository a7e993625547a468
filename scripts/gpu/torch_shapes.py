# GPU check of `cupool check` on training loops the rules were not built
# around. SHAPE: compile (torch.compile'd model), graphs (compiled with
# mode="reduce-overhead": CUDA graphs, a pool of their own, and a new
# graph for the smaller last batch), amp (autocast, GradScaler,
# a convolution net with cudnn.benchmark), eval (an evaluation pass every
# fifth step, a smaller last batch), empty (torch.cuda.empty_cache() every
# step), loader (a DataLoader with two workers and pinned memory), accum
# (four micro-batches a step through activation checkpointing), streams
# (each batch copied in on a side stream, handed over with record_stream),
# sizes (a random batch size every step: the cache grows at each new
# largest), ema (an averaged copy of the weights updated in place, a
# scheduler, the state saved to host memory every tenth step). Clean,
# each must pass; LEAK=1 keeps every step's output for later (the line
# marked ALLOCATED), where the leak is to be found; LEAK_EVERY=N keeps
# only every Nth step's.
import os
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as checkpoint

shape = os.environ.get("SHAPE", "compile")
leak = os.environ.get("LEAK") == "1"
leak_every = int(os.environ.get("LEAK_EVERY", "1"))
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
elif shape == "accum":
    run = lambda x: checkpoint.checkpoint(model, x, use_reentrant=False)
else:
    run = model
if shape == "ema":
    average = [p.detach().clone() for p in model.parameters()]
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cuda", enabled=shape == "amp")
schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 40)
side = torch.cuda.Stream()
sizes = torch.Generator().manual_seed(1)


def batches(steps):
    if shape == "loader":
        data = torch.utils.data.TensorDataset(torch.randn(steps * 64, 512), torch.randn(steps * 64, 10))
        for x, y in torch.utils.data.DataLoader(data, batch_size=64, num_workers=2, pin_memory=True):
            yield x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    elif shape == "streams":
        host = [t.pin_memory() for t in (torch.randn(64, 512), torch.randn(64, 10))]
        for _ in range(steps):
            with torch.cuda.stream(side):
                x, y = (t.cuda(non_blocking=True) for t in host)
            torch.cuda.current_stream().wait_stream(side)
            x.record_stream(torch.cuda.current_stream())
            y.record_stream(torch.cuda.current_stream())
            yield x, y
    elif shape == "sizes":
        for _ in range(steps):
            yield make(int(torch.randint(16, 512, (1,), generator=sizes)))
    else:
        for i in range(steps):
            yield make(37 if (shape in ("eval", "graphs") and i == steps - 1) else 64)


total, kept, saved = 0.0, [], None
for step, (x, y) in enumerate(batches(40)):
    opt.zero_grad(set_to_none=True)
    for part in x.chunk(4) if shape == "accum" else [x]:
        with torch.autocast("cuda", dtype=torch.float16, enabled=shape == "amp"):
            out = run(part)  # ALLOCATED
            loss = F.mse_loss(out, y[: len(part)])
        if leak and step % leak_every == 0:
            kept.append(out.detach())
        scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    total += loss.item()
    if shape == "eval" and step % 5 == 4:
        with torch.no_grad():
            run(make(256)[0]).sum().item()
    if shape == "empty":
        torch.cuda.empty_cache()
    if shape == "ema":
        schedule.step()
        with torch.no_grad():
            torch._foreach_mul_(average, 0.99)
            torch._foreach_add_(average, [p.detach() for p in model.parameters()], alpha=0.01)
        if step % 10 == 9:
            saved = {k: v.to("cpu", non_blocking=True) for k, v in model.state_dict().items()}
torch.cuda.synchronize()
print(f"result: ok {total > 0}")

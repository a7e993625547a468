"""A small PyTorch training loop with one planted leak: the example of
README.md, recorded on a GPU under `cupool check` (scripts/gpu-example-log.sh)
into examples/torch-leak/log/.

Each step is an NVTX range "step N" (so the log's phases are the steps): a
forward pass, the backward pass and an optimizer step on a small MLP. Every
tenth step also evaluates, inside a range "eval". The leak: each step's output
is kept on the GPU for "metrics" (the line marked LEAK), the classic
per-iteration leak; the memory kept is allocated on the line marked
ALLOCATED. STEPS (default 40) sets the number of steps.
"""

import os

import torch

steps = int(os.environ.get("STEPS", "40"))
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(1024, 4096),
    torch.nn.ReLU(),
    torch.nn.Linear(4096, 1024),
).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
outputs = []  # for metrics at the end


def train_step(x):
    out = model(x)  # ALLOCATED
    loss = out.float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return out


def evaluate():
    with torch.no_grad():
        return model(torch.randn(1024, 1024, device="cuda")).abs().mean().item()


for step in range(steps):
    torch.cuda.nvtx.range_push(f"step {step}")
    out = train_step(torch.randn(256, 1024, device="cuda"))
    outputs.append(out)  # LEAK: one 1 MiB output kept per step
    if step % 10 == 9:
        torch.cuda.nvtx.range_push("eval")
        score = evaluate()
        torch.cuda.nvtx.range_pop()
    torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
print(f"result: ok steps={steps} kept={len(outputs)} eval={score:.4f}")

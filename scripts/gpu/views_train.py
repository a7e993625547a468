"""The workload of scripts/gpu-views.sh: a small transformer-ish training
loop with NVTX ranges (epoch, forward, backward, optimizer), so the HTML
report has phases to shade, sites in Python and in CUDA's libraries, and a
pool that grows and shrinks. STEPS (default 60) steps; SLOW=seconds sleeps
after each step so `cupool top` can watch it; LEAK=1 keeps every step's
output (a growing site). Prints one `result:` line."""
import os
import time

import torch

steps = int(os.environ.get("STEPS", "60"))
slow = float(os.environ.get("SLOW", "0"))
leak = os.environ.get("LEAK") == "1"
torch.manual_seed(0)
dev = torch.device("cuda")


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(d, 8, batch_first=True)
        self.ff = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))
        self.n1, self.n2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)

    def forward(self, x):
        h = self.n1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.ff(self.n2(x))


model = torch.nn.Sequential(*[Block(512) for _ in range(4)]).to(dev)
opt = torch.optim.AdamW(model.parameters(), 1e-4)
kept = []
for step in range(steps):
    if step % 20 == 0:
        torch.cuda.nvtx.range_push(f"epoch {step // 20}")
    batch = 8 + (step % 5) * 4
    x = torch.randn(batch, 256, 512, device=dev)
    torch.cuda.nvtx.range_push("forward")
    out = model(x)
    loss = out.float().pow(2).mean()
    torch.cuda.nvtx.range_pop()
    torch.cuda.nvtx.range_push("backward")
    loss.backward()
    torch.cuda.nvtx.range_pop()
    torch.cuda.nvtx.range_push("optimizer")
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.nvtx.range_pop()
    if leak:
        kept.append(out.detach())
    if step % 20 == 19 or step == steps - 1:
        torch.cuda.nvtx.range_pop()
    if slow:
        torch.cuda.synchronize()
        time.sleep(slow)
torch.cuda.synchronize()
print(f"result: ok steps={steps} loss={loss.item():.4f}")

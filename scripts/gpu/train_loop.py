# GPU check of `cupool check` (scripts/gpu-leakcheck.sh): a small training
# loop, no marks. LEAK=1 keeps every step's output alive (the line marked
# LEAK), the classic per-iteration leak: the memory kept is the output
# allocated on the line marked ALLOCATED. Without LEAK the loop is clean.
import os
import torch

torch.manual_seed(0)
leak = os.environ.get("LEAK") == "1"
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 8192)).cuda()
opt = torch.optim.AdamW(model.parameters(), 1e-3)
kept = []
for step in range(200):
    x = torch.randn(512, 1024, device="cuda")
    out = model(x)  # ALLOCATED
    loss = out.float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if leak:
        kept.append(out.detach())  # LEAK
torch.cuda.synchronize()
print(f"result: ok loss={loss.item():.4f}")

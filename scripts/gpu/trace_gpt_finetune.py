# An allocation trace for `cupool replay`: a GPT-2-style model (from its
# config, no download) fine-tuned for 24 steps on batches of varied
# sequence lengths and batch sizes, PyTorch's cache off (every tensor is a
# request), mixed precision.
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=512, n_head=8)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
g = torch.Generator().manual_seed(1)
for step in range(24):
    batch = int(torch.randint(2, 12, (1,), generator=g))
    length = int(torch.randint(32, 384, (1,), generator=g))
    ids = torch.randint(0, 50257, (batch, length), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
print(f"result: ok {loss.item():.3f}")

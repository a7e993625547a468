# Hugging Face GPT-2 built from its config (no download), a few training steps: a trace for `cupool replay`.
import torch
from transformers import GPT2Config, GPT2LMHeadModel
m = GPT2LMHeadModel(GPT2Config(n_layer=6)).cuda()
opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
for i in range(6):
    ids = torch.randint(0, 50257, (8, 128 + 64 * (i % 3)), device="cuda")
    out = m(ids, labels=ids)
    out.loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
print("result: ok")

# GPU check of `cupool check`: a short fine-tuning loop (15 steps, GPT-2
# built from its config, PyTorch's cache on). Clean, it must pass; LEAK=1
# keeps each step's loss with its graph (the line marked ALLOCATED), found
# at that line although the loop is short.
import os
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
leak = os.environ.get("LEAK") == "1"
model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=256, n_head=4)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
history = []
for step in range(15):
    ids = torch.randint(0, 50257, (8, 128), device="cuda")
    logits = model(ids).logits  # ALLOCATED
    loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), ids.view(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if leak:
        history.append(logits.detach())
torch.cuda.synchronize()
print(f"result: ok {loss.item():.3f}")

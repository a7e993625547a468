# GPU check of `cupool check`: Hugging Face generation with its key/value
# cache (GPT-2 built from its config, no download): each new token replaces
# the cache's tensors by larger ones, released when generate() returns.
# Not a leak; it must pass.
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=256, n_head=4)).cuda().eval()
ids = torch.randint(0, 50257, (4, 32), device="cuda")
with torch.no_grad():
    out = model.generate(ids, max_new_tokens=40, do_sample=False, pad_token_id=0)
torch.cuda.synchronize()
print(f"result: ok {tuple(out.shape)}")

# An inference server's loop: requests of varied batch sizes and prompt
# lengths, each generating a varied number of tokens with a growing KV cache
# (GPT-2 from its config, no download): a trace for `cupool replay`.
import random
import torch
from transformers import GPT2Config, GPT2LMHeadModel

random.seed(1)
m = GPT2LMHeadModel(GPT2Config(n_layer=8)).cuda().eval()
with torch.no_grad():
    for request in range(24):
        batch, prompt, new = random.choice([1, 2, 4, 8, 16]), random.randrange(16, 400), random.randrange(8, 48)
        ids = torch.randint(0, 50257, (batch, prompt), device="cuda")
        m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                   do_sample=False, pad_token_id=0)
torch.cuda.synchronize()
print("result: ok")

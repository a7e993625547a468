# An allocation trace for `cupool replay`: a serving-style mix, PyTorch's
# cache off: requests of varied batch and prompt length through a small
# GPT-2 (from its config), each generating a varied number of tokens with
# its KV cache, interleaved with embedding requests of other shapes.
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=384, n_head=6)).cuda().eval().half()
g = torch.Generator().manual_seed(2)
with torch.inference_mode():
    for request in range(40):
        batch = int(torch.randint(1, 9, (1,), generator=g))
        prompt = int(torch.randint(8, 200, (1,), generator=g))
        ids = torch.randint(0, 50257, (batch, prompt), device="cuda")
        if request % 3 == 2:
            hidden = model.transformer(ids).last_hidden_state.mean(1)  # an embedding request
            continue
        new = int(torch.randint(4, 48, (1,), generator=g))
        out = model.generate(ids, max_new_tokens=new, do_sample=False, pad_token_id=0)
torch.cuda.synchronize()
print("result: ok", out.shape[-1])

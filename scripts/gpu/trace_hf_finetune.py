# A Hugging Face model fine-tuned on batches of varied sequence lengths (random
# per step, as a shuffled dataset gives them): a trace for `cupool replay`.
# The model is built from its config (no download).
import random
import torch
from transformers import BertConfig, BertForSequenceClassification

random.seed(0)
m = BertForSequenceClassification(BertConfig(num_hidden_layers=6, num_labels=4)).cuda()
opt = torch.optim.AdamW(m.parameters(), lr=2e-5)
for step in range(16):
    batch, length = random.choice([8, 12, 16]), random.randrange(32, 513, 8)
    ids = torch.randint(0, 30522, (batch, length), device="cuda")
    mask = torch.ones_like(ids)
    mask[:, length - random.randrange(0, length // 2):] = 0
    labels = torch.randint(0, 4, (batch,), device="cuda")
    out = m(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
print("result: ok")

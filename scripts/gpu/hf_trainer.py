# GPU check of `cupool check` on Hugging Face's Trainer, the loop many
# fine-tuning jobs run (GPT-2 built from its config, no download): 40 steps
# with an evaluation every 10 and the optimizer's state made at the first.
# Clean, it must pass; LEAK=1 has a callback keep every step's logits (the
# line marked ALLOCATED makes them), found at that line.
import os
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

torch.manual_seed(0)
leak = os.environ.get("LEAK") == "1"
model = GPT2LMHeadModel(GPT2Config(vocab_size=8000, n_layer=2, n_embd=256, n_head=4))


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 40 * 8

    def __getitem__(self, i):
        ids = torch.randint(0, 8000, (64,))
        return {"input_ids": ids, "labels": ids}


kept = []


class KeepLogits(TrainerCallback):
    def on_step_end(self, args, state, control, model=None, **kw):
        if leak:
            with torch.no_grad():
                kept.append(model(torch.randint(0, 8000, (8, 64), device="cuda")).logits)  # ALLOCATED


with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(out, per_device_train_batch_size=8, per_device_eval_batch_size=8, max_steps=40,
                             eval_strategy="steps", eval_steps=10, logging_steps=10, save_strategy="no",
                             report_to=[], dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), eval_dataset=Tokens(), callbacks=[KeepLogits()])
    result = trainer.train()
torch.cuda.synchronize()
print(f"result: ok {result.global_step}")

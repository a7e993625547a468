# GPU check of `cupool check` on generation shapes the rules were not built
# around (models built from their configs, no download). SHAPE: llama
# (greedy), beam (GPT-2, four beams), sample (top-k, three sequences each),
# t5 (encoder-decoder), repeat (eight generate() calls of growing prompts).
# Clean, each must pass; LEAK=1 keeps every call's output with its scores
# (the line marked ALLOCATED), found at that line.
import os
import torch
import transformers as tf

shape = os.environ.get("SHAPE", "llama")
leak = os.environ.get("LEAK") == "1"
torch.manual_seed(0)
if shape == "llama":
    cfg = tf.LlamaConfig(vocab_size=8000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2)
    model = tf.LlamaForCausalLM(cfg)
elif shape == "t5":
    cfg = tf.T5Config(vocab_size=8000, d_model=256, d_ff=512, num_layers=3, num_heads=4, decoder_start_token_id=0)
    model = tf.T5ForConditionalGeneration(cfg)
else:
    model = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=8000, n_layer=4, n_embd=256, n_head=4))
model = model.cuda().eval()
args = dict(max_new_tokens=32, pad_token_id=0)
if shape == "beam":
    args.update(num_beams=4, do_sample=False)
elif shape == "sample":
    args.update(do_sample=True, top_k=20, num_return_sequences=3)
else:
    args.update(do_sample=False)
if leak:
    args.update(output_scores=True, return_dict_in_generate=True)
kept = []
with torch.no_grad():
    for call in range(8 if shape == "repeat" else 2):
        ids = torch.randint(1, 8000, (4, 16 + 8 * call), device="cuda")
        out = model.generate(ids, **args)  # ALLOCATED
        if leak:
            kept.append(out)
torch.cuda.synchronize()
print(f"result: ok {tuple((out.sequences if leak else out).shape)}")

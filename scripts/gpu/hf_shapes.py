# GPU check of `cupool check` on generation shapes the rules were not built
# around (models built from their configs, no download). SHAPE: llama
# (greedy), beam (GPT-2, four beams), sample (top-k, three sequences each),
# t5 (encoder-decoder), repeat (eight generate() calls of growing prompts),
# static (Llama with a static cache made at the first call), assisted
# (GPT-2 drafted for by a smaller GPT-2), bert (an encoder classifying
# batches of many lengths, padded and masked, eight calls). Clean, each must pass; LEAK=1 keeps every call's output with its scores
# (the line marked ALLOCATED), found at that line.
import os
import torch
import transformers as tf

shape = os.environ.get("SHAPE", "llama")
leak = os.environ.get("LEAK") == "1"
torch.manual_seed(0)
if shape in ("llama", "static"):
    cfg = tf.LlamaConfig(vocab_size=8000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2)
    model = tf.LlamaForCausalLM(cfg)
elif shape == "t5":
    cfg = tf.T5Config(vocab_size=8000, d_model=256, d_ff=512, num_layers=3, num_heads=4, decoder_start_token_id=0)
    model = tf.T5ForConditionalGeneration(cfg)
elif shape == "bert":
    cfg = tf.BertConfig(vocab_size=8000, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                        num_attention_heads=4, num_labels=3)
    model = tf.BertForSequenceClassification(cfg)
else:
    model = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=8000, n_layer=4, n_embd=256, n_head=4))
model = model.cuda().eval()
args = dict(max_new_tokens=32, pad_token_id=0)
if shape == "beam":
    args.update(num_beams=4, do_sample=False)
elif shape == "static":
    args.update(do_sample=False, cache_implementation="static")
elif shape == "assisted":
    draft = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=8000, n_layer=1, n_embd=128, n_head=2))
    args.update(do_sample=False, assistant_model=draft.cuda().eval())
elif shape == "sample":
    args.update(do_sample=True, top_k=20, num_return_sequences=3)
else:
    args.update(do_sample=False)
if leak:
    args.update(output_scores=True, return_dict_in_generate=True)


def call(ids):
    if shape != "bert":
        return model.generate(ids, **args)
    longest = torch.randint(8, ids.shape[1] + 1, (ids.shape[0], 1), device="cuda")
    mask = (torch.arange(ids.shape[1], device="cuda") < longest).long()
    out = model(input_ids=ids, attention_mask=mask, output_hidden_states=leak)
    return out if leak else out.logits.argmax(-1)


kept = []
with torch.no_grad():
    for step in range(8 if shape in ("repeat", "bert") else 2):
        if shape == "bert":
            ids = torch.randint(1, 8000, (16, 24 + 37 * step), device="cuda")
        else:
            ids = torch.randint(1, 8000, (1 if shape == "assisted" else 4, 16 + 8 * step), device="cuda")
        out = call(ids)  # ALLOCATED
        if leak:
            kept.append(out)
torch.cuda.synchronize()
shown = out if not leak else out.logits if shape == "bert" else out.sequences
print(f"result: ok {tuple(shown.shape)}")

# Copied from the team's shared/bench/torch_transformer.py (the baseline workload of shared/notes/baseline-h100.md).
# Benchmark workload of ../notes/baseline-h100.md: PyTorch transformer training with varying sequence lengths.
# Prints ms/iter and memory figures; MODE only labels the output line.
import os, time, sys, torch, torch.nn as nn
torch.manual_seed(0)
dev = "cuda"
model = nn.TransformerEncoder(nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True), 6).to(dev)
opt = torch.optim.AdamW(model.parameters(), 1e-4)
lens = [64, 128, 192, 256, 320, 384, 448, 512]
def step(i):
    L = lens[(i * 7) % len(lens)]
    x = torch.randn(32, L, 512, device=dev)
    loss = model(x).float().pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
for i in range(5): step(i)
torch.cuda.synchronize(); t = time.perf_counter(); N = 60
for i in range(N): step(i)
torch.cuda.synchronize(); dt = (time.perf_counter() - t) / N
s = torch.cuda.memory_stats()
free, total = torch.cuda.mem_get_info()
print(f"mode={os.environ.get('MODE','?')} ms/iter={dt*1e3:.2f} peak_alloc_MiB={s.get('allocated_bytes.all.peak',0)/2**20:.0f} peak_reserved_MiB={s.get('reserved_bytes.all.peak',0)/2**20:.0f} driver_used_MiB={(total-free)/2**20:.0f} num_alloc_retries={s.get('num_alloc_retries',0)} segs={s.get('segment.all.allocated',0)}")

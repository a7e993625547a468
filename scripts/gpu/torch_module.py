"""The cupool Python module under PyTorch: phases, memory figures and
track_peak, run under `cupool run` from the installed wheel. PyTorch's cache
is off (every tensor is one cudaMalloc), so cupool's figures follow each
tensor. Prints one `result:` line."""
import cupool, torch

assert cupool.available(), "not started under cupool"
peaks = []

@cupool.track_peak(report=peaks.append)
def step(n):
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    y = torch.empty(n, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    del x, y

with cupool.phase("warm-up"):
    keep = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
for epoch in range(2):
    cupool.mark(f"epoch {epoch}")
    step(64 << 20)
s = cupool.memory_stats()
ok = (
    s["allocated_bytes.all.current"] >= 32 << 20
    and s["allocated_bytes.all.peak"] >= (32 + 128) << 20
    and s["reserved_bytes.all.current"] >= s["allocated_bytes.all.current"]
    and peaks and peaks[-1].peak_bytes >= (32 + 128) << 20
)
print(f"result: ok={int(ok)} allocated={s['allocated_bytes.all.current']} peak={s['allocated_bytes.all.peak']} "
      f"reserved={s['reserved_bytes.all.current']} step_peak={peaks[-1].peak_bytes if peaks else None}")

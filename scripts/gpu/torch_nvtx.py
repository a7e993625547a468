"""torch.cuda.nvtx ranges under `cupool run` become phases in the log (the
shim is the NVTX tool). PyTorch's cache is off, so each tensor is one
cudaMalloc. Prints one `result:` line; the caller reads the log."""
import torch

x = torch.zeros(1, device="cuda")  # the first CUDA memory: recording starts
for epoch in range(2):
    torch.cuda.nvtx.range_push(f"epoch {epoch}")
    y = torch.empty(16 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.nvtx.range_push("inner")
    z = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    del z
    torch.cuda.nvtx.range_pop()
    del y
print("result: ok=1")

# PyTorch workload for gpu-check.sh: prints the allocator's own count of
# cudaMalloc/cudaFree calls (num_device_alloc/free), which cupool must match.
import torch
torch.manual_seed(0)
x = torch.randn(256, 256, device="cuda")
keep = []
for i in range(300):
    n = 1 + (i * 7919) % (1 << 20)
    t = torch.empty(n, dtype=torch.uint8, device="cuda")
    t.fill_(i % 256)
    if i % 50 == 0:
        keep.append(t)
y = (x @ x).sum().item()
del keep
torch.cuda.synchronize()
s = torch.cuda.memory_stats()
# With the cache off (PYTORCH_NO_CUDA_MEMORY_CACHING=1) every one of the 300
# tensors above is its own cudaMalloc, and PyTorch keeps no statistics.
print(f"result: tensors=300 num_device_alloc={s.get('num_device_alloc', 0)} num_device_free={s.get('num_device_free', 0)} checksum={y:.3f}")

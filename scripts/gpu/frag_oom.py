"""A workload that fragments a pool of fixed segments into an out-of-memory
error under a memory cap, while its live memory stays below the cap.

Each step allocates a buffer of CAP/10 bytes, frees it, then keeps a tensor
of half that plus 2 MiB. A pool of fixed segments puts the kept tensor into
the segment the buffer just left (the remainders of older segments are too
small for it), so every step pins a whole segment of which half stays free
and too small for the next buffer: reserved memory grows by a buffer per
step while live memory grows by half of one. A pool that maps pages can put
the next buffer on the free half-segments' pages.

  CAP_GIB=10 python3 frag_oom.py       (PyTorch's allocator: the cap is set here)
  CAP_GIB=10 NO_TORCH_CAP=1 ...        (the cap comes from outside, e.g. cupool --limit)

Prints `completed N/STEPS` or `OOM at step k/STEPS` with the most live
memory seen, and a checksum of the kept tensors.
"""
import os
import sys

import torch

GIB = 2**30
cap = float(os.environ.get("CAP_GIB", "10")) * GIB
steps = int(os.environ.get("STEPS", "16"))
if not os.environ.get("NO_TORCH_CAP"):
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(cap / total)
size = int(cap / 10) // (2 << 20) * (2 << 20)
keep = size // 2 + (2 << 20)
kept = []
peak_live = 0


def checksum():
    return float(sum(k[:1024].sum().item() for k in kept))


for i in range(steps):
    try:
        big = torch.empty(size, dtype=torch.uint8, device="cuda")
        big.fill_(i % 251)
        peak_live = max(peak_live, size + keep * len(kept))
        del big
        kept.append(torch.full((keep // 4,), float(i), device="cuda"))
    except torch.OutOfMemoryError:
        print(f"OOM at step {i + 1}/{steps}: live {peak_live / GIB:.2f} GiB at most, cap {cap / GIB:.1f} GiB")
        print(f"checksum {checksum()}")
        sys.exit(0)
torch.cuda.synchronize()
print(f"completed {steps}/{steps}: live {peak_live / GIB:.2f} GiB at most, cap {cap / GIB:.1f} GiB")
print(f"checksum {checksum()}")

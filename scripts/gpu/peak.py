# A process whose peak of device memory is one tensor of PEAK_MIB MiB
# (default 64), freed before it exits: the job budget and baseline rows of
# scripts/gpu-leakcheck.sh.
import os

import torch

n = int(os.environ.get("PEAK_MIB", "64")) << 20
a = torch.empty(n, dtype=torch.uint8, device="cuda")
a.fill_(1)
print("result: peak_mib=%d first=%d" % (n >> 20, int(a[:1024].sum())))
del a

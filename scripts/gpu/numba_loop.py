# GPU check of `cupool check`: a numba CUDA kernel loop. Clean, it must
# pass; LEAK=1 keeps each step's device array (the line marked ALLOCATED).
import os
import numpy as np

from numba_common import cuda, scale

leak = os.environ.get("LEAK") == "1"
host = np.ones(1 << 20, dtype=np.float32)
kept = []
for step in range(30):
    d = cuda.to_device(host)  # ALLOCATED
    scale[(d.size + 255) // 256, 256](d, 2.0)
    out = d.copy_to_host()
    if leak:
        kept.append(d)
cuda.synchronize()
print(f"result: ok {float(out[0])}")

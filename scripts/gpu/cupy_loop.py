# GPU check of `cupool check`: a CuPy loop with its memory pool on. Clean,
# it must pass; LEAK=1 keeps each step's result in a dict (the line marked
# ALLOCATED), found at that line.
import os
import cupy as cp

leak = os.environ.get("LEAK") == "1"
kept = {}
a = cp.random.random((1024, 1024), dtype=cp.float32)
for step in range(40):
    b = a * (step + 1)  # ALLOCATED
    s = float(b.sum())
    if leak:
        kept[step] = b
cp.cuda.runtime.deviceSynchronize()
print(f"result: ok {s > 0}")

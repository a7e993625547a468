# What CuPy's record costs an allocation under `cupool check`: N arrays
# made and dropped in a loop (the pool serves each from its cache), timed;
# prints "MODE ns per array". Run plainly and under `cupool check` with
# `-o cupy_history=1` and `=0`.
import os
import time

import cupy as cp

N = int(os.environ.get("N", "200000"))
for _ in range(1000):
    cp.empty(256, dtype=cp.uint8)
t = time.perf_counter()
for _ in range(N):
    cp.empty(256, dtype=cp.uint8)
print(f"{os.environ.get('MODE', 'plain')} {1e9 * (time.perf_counter() - t) / N:.0f} ns per array")

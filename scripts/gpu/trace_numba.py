# An allocation trace for `cupool replay`: a numba CUDA loop that allocates
# device arrays of varied sizes every step (numba frees them when they are
# collected, in batches), with a few arrays kept for the whole run.
import numpy as np

if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack  # numba-cuda still calls it; NumPy 2.5 removed it
from numba import cuda  # noqa: E402


@cuda.jit
def axpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


rng = np.random.default_rng(0)
weights = [cuda.to_device(rng.standard_normal(1 << 18).astype(np.float32)) for _ in range(4)]
for step in range(60):
    n = int(rng.integers(1 << 12, 1 << 21))
    x = cuda.to_device(rng.standard_normal(n).astype(np.float32))
    y = cuda.device_array(n, dtype=np.float32)
    out = cuda.device_array(n, dtype=np.float32)
    y.copy_to_device(np.ones(n, dtype=np.float32))
    axpy[(n + 255) // 256, 256](out, 2.0, x, y)
    total = float(out.copy_to_host()[:8].sum())
cuda.synchronize()
print(f"result: ok {total:.3f}")

# What the numba programs of the GPU checks share: numba's CUDA module, made
# to import on NumPy 2.5, and one kernel.
import numpy as np

if not hasattr(np, "row_stack"):
    # numba-cuda's compiler still calls np.row_stack, which NumPy 2.5
    # removed; its replacement is the same function.
    np.row_stack = np.vstack
from numba import cuda  # noqa: E402


@cuda.jit
def scale(a, s):
    i = cuda.grid(1)
    if i < a.size:
        a[i] *= s

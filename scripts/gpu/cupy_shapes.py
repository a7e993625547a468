# GPU check of `cupool check` on CuPy programs the rules were not built
# around, memory pool on. SHAPE: fft (FFTs of changing lengths: the plan
# cache fills), kernel (raw and elementwise kernels compiled on first use,
# then reused), mixed (arrays of many sizes, sorted, reduced, concatenated),
# linalg (solves and SVDs of changing sizes: cuSOLVER's work areas),
# streams (two streams taken in turn, batches copied in from pinned memory).
# THREAD=1 runs the loop in a thread of its own. Clean, each must pass;
# LEAK=1 keeps one array a step (the line marked ALLOCATED), found at that
# line.
import os
import threading

import cupy as cp
import cupyx

shape = os.environ.get("SHAPE", "fft")
leak = os.environ.get("LEAK") == "1"
scale = cp.ElementwiseKernel("float32 x, float32 a", "float32 y", "y = x * a + 1.0f", "scale_one")
square = cp.RawKernel(r'''extern "C" __global__ void sq(float* v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) v[i] *= v[i]; }''', "sq")
kept = []
streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]


def run():
    rng = cp.random.default_rng(0)
    for step in range(40):
        if shape == "fft":
            n = 1 << (14 + step % 6)
            a = cp.fft.irfft(cp.fft.rfft(rng.random(n, dtype=cp.float32)), n)
        elif shape == "kernel":
            a = scale(rng.random(1 << 20, dtype=cp.float32), cp.float32(step))
            square((256,), (1024,), (a, cp.int32(a.size)))
        elif shape == "linalg":
            n = 64 * (1 + step % 7)
            m = rng.random((n, n), dtype=cp.float32) + n * cp.eye(n, dtype=cp.float32)
            a = cp.linalg.solve(m, rng.random(n, dtype=cp.float32)) + cp.linalg.svd(m, compute_uv=False)[:n]
        elif shape == "streams":
            with streams[step % 2]:
                host = cupyx.empty_pinned((1 << 18,), dtype=cp.float32)
                host[:] = step
                a = cp.empty(host.shape, dtype=host.dtype)
                a.set(host, stream=streams[step % 2])
                a = cp.cumsum(a)
                streams[step % 2].synchronize()
        else:
            parts = [rng.random(1000 + 777 * k * (step % 5 + 1), dtype=cp.float32) for k in range(6)]
            a = cp.sort(cp.concatenate(parts))[::3]
        if leak:
            kept.append(a * 2)  # ALLOCATED
        kept.append(float(a.sum()))
    cp.cuda.runtime.deviceSynchronize()


if os.environ.get("THREAD") == "1":
    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
else:
    run()
print(f"result: ok {kept[-1] == kept[-1]}")

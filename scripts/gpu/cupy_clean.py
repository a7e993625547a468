# GPU check of `cupool check`: CuPy with cuBLAS (matmul) and cuFFT, clean.
import cupy as cp

for _ in range(10):
    a = cp.random.random((1024, 1024), dtype=cp.float32)
    b = a @ a
    f = cp.fft.fft2(b)
    s = float(cp.abs(f).sum())
cp.cuda.runtime.deviceSynchronize()
print(f"result: ok {s > 0}")

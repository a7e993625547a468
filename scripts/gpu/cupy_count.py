# CuPy workload for gpu-check.sh: with CuPy's pool off, every array is one
# cudaMalloc; the program counts the arrays it made.
import cupy as cp
cp.cuda.set_allocator(None)
arrays = 0
for i in range(200):
    a = cp.arange(1 + (i * 7919) % 100000, dtype=cp.float32)
    arrays += 1
    del a
x = cp.random.rand(512, 512, dtype=cp.float32)
arrays += 1
y = float((x @ x).sum()) + float(cp.abs(cp.fft.fft(x[0])).sum())
print(f"result: arrays={arrays} checksum_ok={y > 0}")

# GPU check of allocation sites (scripts/gpu-sites.sh) for CuPy.
import cupy as cp

a = cp.arange(1 << 20, dtype=cp.float32)
b = cp.fft.fft(a)
(a @ a).get()


def planted():
    return cp.empty(512 << 20, dtype=cp.uint8)  # PLANTED


big = planted()
big.fill(1)
cp.cuda.runtime.deviceSynchronize()
print("result: ok")

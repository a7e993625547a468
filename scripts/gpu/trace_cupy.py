# An allocation trace for `cupool replay`: a CuPy analysis script with its
# memory pool off (every array is a request): arrays of many sizes,
# elementwise work, reductions, FFTs, sorts and a matrix product, with
# results kept across iterations the way scripts keep them.
import cupy as cp

cp.cuda.set_allocator(None)
rng = cp.random.default_rng(0)
kept = []
for it in range(40):
    n = 1 << (14 + it % 8)  # 16 Ki .. 2 Mi elements
    a = rng.standard_normal(n, dtype=cp.float32)
    b = cp.sin(a) * cp.cos(a) + a ** 2
    spectrum = cp.abs(cp.fft.rfft(b))
    top = cp.sort(spectrum)[-16:]
    m = rng.standard_normal((256 + 32 * (it % 5), 256), dtype=cp.float32)
    p = m @ m.T
    kept.append((top, p.sum(axis=0)))
    if len(kept) > 12:
        kept.pop(0)
cp.cuda.Device().synchronize()
print("result: ok", float(kept[-1][0][-1]))

# Quick re-check of the pool-by-default fixes: cudaDeviceReset with the
# shared and static runtime, and CuPy's own memory tests (stream-ordered
# allocations after a bulk free) plainly and under cupool.
export PATH=/usr/local/cuda/bin:$PATH
w=$(mktemp -d); src=scripts/gpu; root=$(pwd)
nvcc -O2 -arch=native -cudart shared -o $w/reset_shared $src/reset_data.cu
nvcc -O2 -arch=native -o $w/reset_static $src/reset_data.cu
for p in reset_shared reset_static; do echo "$p plain: $($w/$p)"; echo "$p pool: $(.gpu/cupool run -q --log-dir $w/l-$p -- $w/$p)"; done
cd .gpu/suites/cupy
t=tests/cupy_tests/cuda_tests/test_memory.py
for how in plain pool; do
  pre=""; [ $how = pool ] && pre="$root/.gpu/cupool run -q --log-dir $w/l-cupy --"
  timeout 200 $pre python3 -m pytest -q -p no:cacheprovider $t 2>&1 | grep -E "^FAILED|passed|failed" | sed "s/^/[$how] /"
done

#!/usr/bin/env bash
# Allocation sites on a real GPU: for an nvcc program (static and shared
# cudart, built with -g), PyTorch (cache on and off), CuPy and JAX, a planted
# large allocation must be the report's top site by peak bytes, and that
# site's frames must name the planted line. Also: the Python frame reader
# against this machine's Python. Same setup as scripts/gpu-check.sh (.gpu/
# holds the shim, the CLI and libpyprobe.so); prints a table last.
set -u
export PATH=/usr/local/cuda/bin:$PATH
root=$(pwd); bin=$root/.gpu; src=$root/scripts/gpu; work=$(mktemp -d /tmp/cupool-sites.XXXX)
rows=()
python3 --version
nvcc -g -O2 -arch=native -cudart shared -o $work/sites_shared $src/sites.cu
nvcc -g -O2 -arch=native -o $work/sites_static $src/sites.cu

# site NAME SOURCE -- CMD...
site() {
  local name=$1 source=$2; shift 3
  $bin/cupool run -q --log-dir $work/$name -- "$@" > $work/$name.out 2>&1
  $bin/cupool report --json --sites 3 $work/$name > $work/$name.json 2> $work/$name.report-err
  rows+=("$(python3 $src/site_check.py $name $work/$name.json $source)")
}
site nvcc-shared $src/sites.cu -- $work/sites_shared
site nvcc-static $src/sites.cu -- $work/sites_static
site torch-caching $src/torch_sites.py -- python3 $src/torch_sites.py
PYTORCH_NO_CUDA_MEMORY_CACHING=1 site torch-no-caching $src/torch_sites.py -- python3 $src/torch_sites.py
site cupy $src/cupy_sites.py -- python3 $src/cupy_sites.py
XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_ALLOCATOR=platform site jax-platform $src/jax_sites.py -- python3 $src/jax_sites.py

# The text report of one of them, as a user sees it.
$bin/cupool report --sites 2 $work/torch-no-caching 2>&1 | tail -n 30

if [ -f $bin/libpyprobe.so ]; then
  while read -r line; do rows+=("$(printf '%-24s | %s' pyprobe "$line")"); done < <(python3 $root/capture/tests/pyprobe_check.py $bin/libpyprobe.so 2>&1 | tail -n 12)
fi
tar czf ${OUT:-$work}/gpu-sites-logs.tgz -C $work . 2>/dev/null
echo
printf '%s\n' "${rows[@]}"

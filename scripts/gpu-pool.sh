#!/usr/bin/env bash
# The pool by default, shown safe on a real GPU: stream capture and CUDA
# graphs (nvcc static and shared cudart, PyTorch with its cache on and off),
# kernels launched through cudaLaunchKernelEx and cudaLaunchCooperativeKernel,
# a block handed to another thread's per-thread default stream,
# a static runtime's invisible cudaDeviceReset, and memory freed in bulk that
# another process must be able to take (C, PyTorch, CuPy). Every case runs
# the program plainly and under `cupool run` with the default options (pool
# mode) and compares. Run on the GPU machine from the repository root,
# with the built shim and CLI in .gpu/:
#   bash scripts/gpu-pool.sh            (prints a table last)
set -u
export PATH=/usr/local/cuda/bin:$PATH
root=$(pwd)
bin=$root/.gpu
src=$root/scripts/gpu
work=$(mktemp -d /tmp/cupool-pool.XXXX)
rows=()
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

build() { nvcc -O2 -arch=native "$@" 2>&1 | grep -v "^$" >&2; }
build -o $work/graph_static $src/graph.cu -lcuda
build -cudart shared -o $work/graph_shared $src/graph.cu -lcuda
build -o $work/reset_static $src/reset_data.cu
build -cudart shared -o $work/reset_shared $src/reset_data.cu
build -o $work/give_back $src/give_back.cu
build -o $work/launch_ex_static $src/launch_ex.cu
build -cudart shared -o $work/launch_ex_shared $src/launch_ex.cu
build -cudart shared --default-stream per-thread -o $work/launch_ex_ptds $src/launch_ex.cu
build --default-stream per-thread -o $work/handoff_static $src/ptds_handoff.cu
build -cudart shared --default-stream per-thread -o $work/handoff_shared $src/ptds_handoff.cu

# same NAME -- CMD...: the program's output (every line) must be the same
# plainly and under cupool; the exit status too.
same() {
  local name=$1; shift; shift
  local d=$work/$name; mkdir -p $d
  timeout 300 "$@" >$d/plain.out 2>$d/plain.err; local rc_plain=$?
  timeout 300 $bin/cupool run -q --log-dir $d/logs -- "$@" >$d/shim.out 2>$d/shim.err; local rc_shim=$?
  local verdict=FAIL
  if cmp -s $d/plain.out $d/shim.out && [ $rc_plain = $rc_shim ] && [ -s $d/plain.out ]; then verdict=PASS; fi
  local notes
  notes=$(python3 -c "import json,glob; [print('; '.join(json.load(open(f))['end'].get('notes', []))) for f in glob.glob('$d/logs/latest/cupool.*.json')]" 2>/dev/null | grep -v '^$' | head -2 | tr '\n' ' ')
  rows+=("$(printf '%-22s' $name) | $verdict | rc=$rc_plain/$rc_shim $(tail -n 1 $d/shim.out | cut -c1-110) ${notes:+notes: ${notes:0:160}}")
  if [ $verdict = FAIL ]; then diff $d/plain.out $d/shim.out | head -20 | sed "s/^/[$name] /" >&2; tail -5 $d/shim.err | sed "s/^/[$name] /" >&2; fi
}

same graph-static -- $work/graph_static
same graph-shared -- $work/graph_shared
same reset-static -- $work/reset_static
same reset-shared -- $work/reset_shared
same torch-graph -- python3 $src/torch_graph.py
same launch-ex-static -- $work/launch_ex_static
same launch-ex-shared -- $work/launch_ex_shared
same launch-ex-ptds -- $work/launch_ex_ptds
same ptds-handoff-static -- $work/handoff_static
same ptds-handoff-shared -- $work/handoff_shared
PYTORCH_NO_CUDA_MEMORY_CACHING=1 same torch-graph-nocache -- python3 $src/torch_graph.py
for prog in graph_static graph_shared; do
  echo "== $prog" >&2; cat $work/graph-${prog#graph_}/plain.out >&2
done

# give NAME -- CMD...: A under cupool frees in bulk; B (under cupool, then
# without it) must get the memory, as it does when A runs plainly.
give() {
  local name=$1; shift; shift
  local plain shim
  plain=$(timeout 300 "$@" 2>/dev/null | grep '^result:')
  shim=$(timeout 300 $bin/cupool run -q --log-dir $work/$name -- "$@" 2>/dev/null | grep '^result:')
  local verdict=FAIL
  if echo "$plain" | grep -q 'B_got_it=1 B_without_cupool_got_it=1' && echo "$shim" | grep -q 'B_got_it=1 B_without_cupool_got_it=1'; then verdict=PASS; fi
  rows+=("$(printf '%-22s' $name) | $verdict | cupool: ${shim#result: } | plain: ${plain#result: }")
}
give give-back-c -- $work/give_back
give give-back-torch -- python3 $src/give_back.py torch
give give-back-cupy -- python3 $src/give_back.py cupy

tar czf ${OUT:-$work}/gpu-pool-logs.tgz -C $work . 2>/dev/null
echo
echo "case                   | verdict | figures"
printf '%s\n' "${rows[@]}"

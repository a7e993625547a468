#!/usr/bin/env bash
# The hook bench's own loop (benches/hook_pair.c: cudaMalloc(4 KiB)+cudaFree,
# best of 5 rounds of 300,000 pairs) against the real runtime, shared and
# static, under the shim in .gpu/ and, when .gpu/old/libcupool.so exists (an
# earlier build to compare with), under that one too, interleaved for ROUNDS
# rounds (5) on one machine. Prints min and median ns per pair for each row.
# Plain cudaMalloc is left out: its pair costs ~80 us (scripts/gpu-bench.sh
# has it). The yardstick is CUDA's own pool, one thread's
# cudaMallocAsync+cudaFreeAsync pair of 4 KiB on its stream
# (scripts/gpu/scaling.cu), run in the same rounds: each row's median over
# that pair's median, and its best round over that pair's best (a host where
# the yardstick's rounds spread widely moves the first, hardly the second).
# The `driver` rows make the pairs with cuMemAlloc_v2+cuMemFree_v2 from the
# shared-runtime program: the hooks a static runtime's cudaMalloc reaches, so
# that the static rows minus these are the static runtime's own cost.
# PIN=N runs every process on vCPU N alone (taskset), so that rounds differ
# by the build and options, not by where the scheduler put them.
# ROWS="RUNTIME:OPTIONS ..." replaces the rows (runtime shared, static or
# driver; options as CUPOOL_OPTIONS), e.g. ROWS="shared:trace=0 shared:trace=0:magazines=always".
set -u
export PATH=/usr/local/cuda/bin:$PATH
root=$(pwd); w=$(mktemp -d /tmp/cupool-hotpath.XXXX)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
{ echo "#include <cuda_runtime.h>"; grep -v "^int cuda" $root/benches/hook_pair.c; } > $w/hp.cu
nvcc -O2 -cudart shared -o $w/hp_shared $w/hp.cu -lcuda
nvcc -O2 -o $w/hp_static $w/hp.cu -lcuda
nvcc -O2 -arch=native -cudart shared -o $w/async_pair $root/scripts/gpu/scaling.cu
builds="new"; [ -f $root/.gpu/old/libcupool.so ] && builds="old new"
nost=stack_depth=0:python_depth=0
rows=${ROWS:-"shared:trace=0:$nost shared:trace=0 shared:trace=1 static:trace=0:$nost static:trace=0 driver:trace=0:$nost driver:trace=0"}
for round in $(seq ${ROUNDS:-5}); do
  ns=$(${PIN:+taskset -c $PIN} $w/async_pair 1 100000 0 async | sed -n 's/.* loop_ns_per_pair=\([0-9.]*\).*/\1/p')
  echo "async cudaMallocAsync+cudaFreeAsync cuda $ns 0" >> $w/all.txt
  for row in $rows; do
    for b in $builds; do
      lib=$root/.gpu/libcupool.so; [ $b = old ] && lib=$root/.gpu/old/libcupool.so
      rt=${row%%:*}; opts=${row#*:}
      rm -rf $w/logs
      prog=($w/hp_$rt 300000); [ $rt = driver ] && prog=($w/hp_shared 300000 driver)
      ns=$(CUPOOL_OPTIONS=$opts:log_dir=$w/logs LD_PRELOAD=$lib ${PIN:+taskset -c $PIN} "${prog[@]}" | sed 's/.*=//')
      # Events the writer could not keep up with are dropped: a traced row
      # counts only with its whole trace written.
      dropped=$(cat $w/logs/*.json 2>/dev/null | grep -o '"dropped_events":[0-9]*' | sed 's/.*://' | head -1)
      echo "$rt $opts $b $ns ${dropped:-0}" >> $w/all.txt
    done
  done
done
echo "cudart  options                                   build  min_ns  median_ns  max_dropped  x_async  x_async_min  (${ROUNDS:-5} rounds${PIN:+, on vCPU $PIN})"
python3 - $w/all.txt <<'PY'
import sys, statistics, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    rt, opts, b, ns, dropped = line.split()
    rows[(rt, opts, b)].append((float(ns), int(dropped)))
async_ns = [x for x, _ in rows[("async", "cudaMallocAsync+cudaFreeAsync", "cuda")]]
yardstick, best_yardstick = statistics.median(async_ns), min(async_ns)
for (rt, opts, b), v in rows.items():
    ns = [x for x, _ in v]
    med = statistics.median(ns)
    print(
        f"{rt:7s} {opts:41s} {b:5s} {min(ns):7.1f}  {med:9.1f}  {max(d for _, d in v):11d}  {med / yardstick:7.3f}"
        f"  {min(ns) / best_yardstick:11.3f}"
    )
PY

#!/usr/bin/env bash
# Does the log's writer thread keep up with a traced loop, and what does the
# loop pay? The hook bench's loop (benches/hook_pair.c: 5 rounds of N
# cudaMalloc(4 KiB)+cudaFree pairs, N=10^6 unless set) on the real runtime,
# traced and not, under the shim in .gpu/ and, when .gpu/old/libcupool.so
# exists, that build too, alternated for ROUNDS rounds (4). Prints each run's
# best round (pair_ns), its peak resident memory (events waiting for the
# writer), its page faults and the events the log dropped.
set -u
export PATH=/usr/local/cuda/bin:$PATH
root=$(pwd); w=$(mktemp -d /tmp/traced.XXXX)
{ echo "#include <cuda_runtime.h>"; grep -v "^int cuda" benches/hook_pair.c; } > $w/hp.cu
nvcc -O2 -cudart shared -o $w/hp $w/hp.cu -lcuda || exit 1
builds="new"; [ -f $root/.gpu/old/libcupool.so ] && builds="old new"
for r in $(seq ${ROUNDS:-4}); do
  for b in $builds; do
    so=$root/.gpu/libcupool.so; [ $b = old ] && so=$root/.gpu/old/libcupool.so
    for t in 1 0; do
      rm -rf $w/logs
      out=$(CUPOOL_OPTIONS=trace=$t:log_dir=$w/logs LD_PRELOAD=$so /usr/bin/time -f "faults=%R max_rss_kb=%M wall_s=%e" $w/hp ${N:-1000000} 2>&1 | tr '\n' ' ')
      dropped=$(python3 -c "import json,glob; print(json.load(open(glob.glob('$w/logs/cupool.*.json')[0]))['end']['dropped_events'])" 2>/dev/null)
      echo "$b trace=$t $out dropped=${dropped:--}"
    done
  done
done

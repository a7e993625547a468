#!/usr/bin/env bash
# Threads allocating at once, the shim in .gpu/ against an earlier build in
# .gpu/old/, interleaved: pairs/s of cudaMalloc(4 KiB)+cudaFree from 1, 2 and
# 8 threads on streams of their own without kernels (scripts/gpu/scaling.cu;
# PAIRS per thread, 100000 unless set),
# sites off, trace off, and the default options (every event traced; the
# events the writer dropped shown after each figure), five rounds, every value printed; then the
# 8-thread stress (10^6 operations) twice per build. gpu-threads.sh runs each
# build's row in turn, which this machine's drift can bias; this one
# alternates the builds run by run. Run from the repository root on the GPU.
set -u
export PATH=/usr/local/cuda/bin:$PATH
root=$(pwd); src=$root/scripts/gpu; w=$(mktemp -d /tmp/pt.XXXX)
for p in scaling stress; do nvcc -O2 -arch=native -cudart shared -o $w/$p $src/$p.cu || exit 1; done
nost=stack_depth=0:python_depth=0
for i in 1 2 3 4 5; do
  for b in old new; do
    lib=$root/.gpu/libcupool.so; [ $b = old ] && lib=$root/.gpu/old/libcupool.so
    for t in 1 2 8; do
    echo "$b sitesoff-$t $(CUPOOL_OPTIONS=trace=0:$nost:log_dir=$w/l LD_PRELOAD=$lib $w/scaling $t ${PAIRS:-100000} 0 | sed -n 's/.*pairs_per_s=\([0-9]*\).*/\1/p')"
    echo "$b notrace-$t $(CUPOOL_OPTIONS=trace=0:log_dir=$w/l LD_PRELOAD=$lib $w/scaling $t ${PAIRS:-100000} 0 | sed -n 's/.*pairs_per_s=\([0-9]*\).*/\1/p')"
    # The default options trace every event: a row counts only with its whole trace written.
    rm -rf $w/t
    r=$(CUPOOL_OPTIONS=log_dir=$w/t LD_PRELOAD=$lib $w/scaling $t ${PAIRS:-100000} 0 | sed -n 's/.*pairs_per_s=\([0-9]*\).*/\1/p')
    echo "$b default-$t $r/dropped=$(cat $w/t/*.json | grep -o '"dropped_events":[0-9]*' | sed 's/.*://' | head -1)"
    done
  done
done | sort | awk '{a[$1" "$2]=a[$1" "$2]" "$3} END {for (k in a) print k, a[k]}' | sort -k2
for i in 1 2; do for b in old new; do
  lib=$root/.gpu/libcupool.so; [ $b = old ] && lib=$root/.gpu/old/libcupool.so
  s=$( { /usr/bin/time -f "%e s" bash -c "CUPOOL_OPTIONS=trace=0:log_dir=$w/l LD_PRELOAD=$lib $w/stress 1000000" ; } 2>&1 | tr '\n' ' ')
  echo "stress $b: $s"
done; done

#!/usr/bin/env bash
# What allocation sites cost a pooled pair on a real GPU, in a loop that
# keeps its own values in registers (scripts/gpu/scaling.cu: a thread's
# loop on its own stream, no kernels), sites on (the default) and off, from
# one thread and from eight; the shim in .gpu/libcupool.so and, when
# .gpu/old/libcupool.so exists (an earlier build), that one too,
# alternated for ROUNDS rounds (3 unless set). Prints medians of pairs/s and
# of the threads' CPU ns per pair last. Run from the repository root.
set -u
export PATH=/usr/local/cuda/bin:$PATH
root=$(pwd); w=$(mktemp -d /tmp/sitecost.XXXX)
nvcc -O2 -arch=native -cudart shared -o $w/scaling scripts/gpu/scaling.cu || exit 1
builds="new"; [ -f $root/.gpu/old/libcupool.so ] && builds="old new"
for r in $(seq ${ROUNDS:-3}); do
  for b in $builds; do
    lib=$root/.gpu/libcupool.so; [ $b = old ] && lib=$root/.gpu/old/libcupool.so
    for sites in on off; do
      o=trace=0; [ $sites = off ] && o=$o:stack_depth=0:python_depth=0
      for t in 1 8; do
        echo "$b $sites $t $(CUPOOL_OPTIONS=$o:log_dir=$w/l LD_PRELOAD=$lib $w/scaling $t 1000000 0 keep |
          grep -o 'pairs_per_s=[0-9]* cpu_ns_per_pair=[0-9]*' | sed 's/[a-z_]*=//g')"
      done
    done
  done
done | tee $w/rows
python3 - $w/rows <<'PY'
import collections, statistics as st, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    b, sites, t, rate, cpu = line.split()
    runs[(b, sites, int(t))].append((float(rate), float(cpu)))
print(f"{'build':6} {'sites':5} {'threads':>7} {'M pairs/s':>10} {'CPU ns/pair':>11}")
for (b, sites, t), v in sorted(runs.items()):
    print(f"{b:6} {sites:5} {t:7d} {st.median(x for x, _ in v) / 1e6:10.2f} {st.median(c for _, c in v):11.0f}")
PY

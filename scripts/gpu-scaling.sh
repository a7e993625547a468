#!/usr/bin/env bash
# Thread scaling of the pooled pair against CUDA's own stream-ordered pool,
# side by side in one run: each thread repeats cudaMalloc(4 KiB)+cudaFree on
# a stream of its own without kernels (scripts/gpu/scaling.cu), 1/2/4/8
# threads, ROUNDS rounds (5 unless set) interleaved, medians of
#   - the wall-clock rate (M pairs/s over all threads) and
#   - the CPU time the threads spent per pair (ns; thread CPU clocks).
# Flat CPU ns per pair from 1 to 8 threads means the threads do not slow each
# other down; the wall rate then scales as far as the machine runs eight busy
# cores as fast as one (shown by the control row: glibc malloc+free of 4 KiB
# from the same threads, which share nothing).
# Rows: cudaMallocAsync (no shim); cupool's default path (trace off, sites
# on); cupool's magazine path alone (magazines=always, sites off), the same
# path from one thread to eight. Run from the repository root on the GPU,
# with the shim in .gpu/libcupool.so (or SHIM=path).
set -u
export PATH=/usr/local/cuda/bin:$PATH
root=$(pwd); w=$(mktemp -d /tmp/sc.XXXX); shim=${SHIM:-$root/.gpu/libcupool.so}
nvcc -O2 -arch=native -cudart shared -o $w/scaling scripts/gpu/scaling.cu || exit 1
cat > $w/ctl.c <<'C'
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static long pairs;
static double cpu[64];
static double now(clockid_t c) { struct timespec t; clock_gettime(c, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void *run(void *arg) {
    double c0 = now(CLOCK_THREAD_CPUTIME_ID);
    for (long i = 0; i < pairs; i++) { volatile char *p = malloc(4096); p[0] = 1; free((void *)p); }
    cpu[(long)arg] = now(CLOCK_THREAD_CPUTIME_ID) - c0;
    return 0;
}
int main(int argc, char **argv) {
    int threads = atoi(argv[1]); pairs = atol(argv[2]); pthread_t th[64]; double sum = 0;
    double t0 = now(CLOCK_MONOTONIC);
    for (long i = 0; i < threads; i++) pthread_create(&th[i], 0, run, (void *)i);
    for (int i = 0; i < threads; i++) pthread_join(th[i], 0);
    double s = now(CLOCK_MONOTONIC) - t0;
    for (int i = 0; i < threads; i++) sum += cpu[i];
    printf("result: pairs_per_s=%.0f cpu_ns_per_pair=%.1f\n", threads * pairs / s, sum * 1e9 / (threads * pairs));
}
C
cc -O2 -pthread -o $w/ctl $w/ctl.c || exit 1
pairs=${PAIRS:-1000000}
row() { # name threads command...
  local name=$1 t=$2; shift 2
  "$@" | sed -n "s/.*pairs_per_s=\([0-9]*\).*cpu_ns_per_pair=\([0-9.]*\).*/$name $t \1 \2/p"
}
for r in $(seq ${ROUNDS:-5}); do
  for t in 1 2 4 8; do
    row control $t $w/ctl $t $((pairs * 10))
    # CUDA's pool slows to ~0.2 M pairs/s from several threads: fewer pairs keep its rows short.
    row cudaMallocAsync $t $w/scaling $t $((pairs / 20)) 0 async
    row cupool-default $t env CUPOOL_OPTIONS=trace=0:log_dir=$w/l LD_PRELOAD=$shim $w/scaling $t $pairs 0
    row cupool-magazines $t env CUPOOL_OPTIONS=trace=0:stack_depth=0:python_depth=0:magazines=always:log_dir=$w/l \
      LD_PRELOAD=$shim $w/scaling $t $pairs 0
  done
done > $w/rows
echo "rows (every round): name threads pairs/s cpu_ns_per_pair"; sort -k1,1 -k2n $w/rows
python3 - $w/rows <<'PY'
import sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    name, t, rate, cpu = line.split()
    rows.setdefault((name, int(t)), []).append((float(rate), float(cpu)))
print(f"{'medians':18} {'threads':>7} {'M pairs/s':>10} {'x 1 thread':>10} {'CPU ns/pair':>11} {'x 1 thread':>10}")
for name in ["control", "cudaMallocAsync", "cupool-default", "cupool-magazines"]:
    one = rows.get((name, 1))
    if not one:
        continue
    rate1, cpu1 = st.median(x for x, _ in one), st.median(c for _, c in one)
    for t in [1, 2, 4, 8]:
        r = rows.get((name, t))
        if not r:
            continue
        rate, cpu = st.median(x for x, _ in r), st.median(c for _, c in r)
        print(f"{name:18} {t:7d} {rate/1e6:10.2f} {rate/rate1:10.2f} {cpu:11.1f} {cpu/cpu1:10.2f}")
PY

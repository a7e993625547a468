#!/usr/bin/env bash
# Hook overhead on the CPU, no GPU needed: cudaMalloc(4 KiB)+cudaFree pairs
# through the fake CUDA runtime (built by the test suite), plain and under the
# shim in each mode, side by side in one run. Prints the best of 5 rounds, ns/pair;
# then pairs per second from 1, 2 and 4 threads on streams of their own.
set -eu
cd "$(dirname "$0")/.."
cargo build --release -q
cargo test --release -q --test fake_cuda >/dev/null   # builds the fake driver/runtime
fake=$(realpath --relative-to=. target/fake-cuda/current)  # the build the tests just used
cc -O2 benches/hook_pair.c -o target/hook_pair -L"$fake" -l:libcudart.so.13 -l:libcuda.so.1 -Wl,-rpath,"$PWD/$fake"
cc -O2 benches/hook_threads.c -o target/hook_threads -L"$fake" -l:libcudart.so.13 -Wl,-rpath,"$PWD/$fake" -pthread
export LD_LIBRARY_PATH=$fake
n=${1:-300000}
printf '%-62s %s\n' "fake runtime, no shim" "$(target/hook_pair $n)"
# Allocation sites (stack_depth, python_depth) are on by default; the first four rows turn them off.
nostacks=stack_depth=0:python_depth=0
# The pool rows run on each backing: vmm (the default) and segments.
for o in mode=passthrough:trace=0:$nostacks mode=passthrough:trace=1:$nostacks \
         mode=pool:backing=vmm:trace=0:$nostacks mode=pool:backing=segments:trace=0:$nostacks \
         mode=pool:backing=vmm:trace=1:$nostacks mode=pool:backing=segments:trace=1:$nostacks \
         mode=pool:trace=0 mode=pool:backing=segments:trace=0 mode=pool:trace=1; do
  logs=target/hook-bench-logs/row; rm -rf $logs
  ns=$(CUPOOL_OPTIONS=$o:log_dir=$logs LD_PRELOAD=$PWD/target/release/libcupool.so target/hook_pair $n)
  # A traced row counts only with its whole trace written: events the writer
  # could not keep up with are dropped (and counted in the log's end record).
  dropped=$(cat $logs/*.json 2>/dev/null | grep -o '"dropped_events":[0-9]*' | sed 's/.*://' | head -1)
  printf '%-62s %s%s\n' "$o" "$ns" "${dropped:+ dropped_events=$dropped}"
done
# The same pairs through the driver API's hooks (cuMemAlloc_v2+cuMemFree_v2,
# where a static runtime's cudaMalloc reaches cupool), sites off and on.
for o in mode=pool:trace=0:$nostacks mode=pool:trace=0; do
  printf '%-62s %s\n' "$o, driver API" "$(CUPOOL_OPTIONS=$o:log_dir=target/hook-bench-logs \
    LD_PRELOAD=$PWD/target/release/libcupool.so target/hook_pair $n driver)"
done
# The same pairs from a loop that keeps its own values in the callee-saved
# registers (rbp among them), which the hooks save on the stack: a site's
# walk reads them; sites off and on.
for o in mode=pool:trace=0:$nostacks mode=pool:trace=0; do
  printf '%-62s %s\n' "$o, busy registers" "$(CUPOOL_OPTIONS=$o:log_dir=target/hook-bench-logs \
    LD_PRELOAD=$PWD/target/release/libcupool.so target/hook_pair $n busy)"
done
# Several threads, each with a stream of its own (fenced frees): pairs per
# second over all threads, best of 3, sites off and on. Threads that meet on
# the pool's lock take blocks from magazines of their own (option magazines).
for sites in off on; do
  opts=mode=pool:trace=0; [ $sites = off ] && opts=$opts:$nostacks
  for t in 1 2 4; do
    best=$(for r in 1 2 3; do CUPOOL_OPTIONS=$opts:log_dir=target/hook-bench-logs \
      LD_PRELOAD=$PWD/target/release/libcupool.so target/hook_threads $t $n | sed 's/.*=//'; done | sort -n | tail -1)
    printf '%-62s %s\n' "pool, sites $sites, $t thread(s) on own streams" "pairs_per_s=$best"
  done
done
# Sizes that seldom come back (each drawn from 1..64 KiB): a magazine must
# not make them dearer than the pool alone (magazines=never).
for mag in auto never; do
  for t in 1 2; do
    best=$(for r in 1 2 3; do CUPOOL_OPTIONS=mode=pool:trace=0:$nostacks:magazines=$mag:log_dir=target/hook-bench-logs \
      LD_PRELOAD=$PWD/target/release/libcupool.so target/hook_threads $t $n 65536 | sed 's/.*=//'; done | sort -n | tail -1)
    printf '%-62s %s\n' "pool, sizes up to 64 KiB, magazines=$mag, $t thread(s)" "pairs_per_s=$best"
  done
done
rm -rf target/hook-bench-logs

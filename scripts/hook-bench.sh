#!/usr/bin/env bash
# Hook overhead on the CPU, no GPU needed: cudaMalloc(4 KiB)+cudaFree pairs
# through the fake CUDA runtime (built by the test suite), plain and under the
# shim in each mode, side by side in one run. Prints the best of 5 rounds, ns/pair.
set -eu
cd "$(dirname "$0")/.."
cargo build --release -q
cargo test --release -q --test fake_cuda >/dev/null   # builds the fake driver/runtime
fake=$(ls -td target/fake-cuda/*/ | grep -v scratch | head -1)
cc -O2 benches/hook_pair.c -o target/hook_pair -L"$fake" -l:libcudart.so.13 -Wl,-rpath,"$PWD/$fake"
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
  printf '%-62s %s\n' "$o" "$(CUPOOL_OPTIONS=$o:log_dir=target/hook-bench-logs LD_PRELOAD=$PWD/target/release/libcupool.so target/hook_pair $n)"
done
rm -rf target/hook-bench-logs

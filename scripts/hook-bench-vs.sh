#!/usr/bin/env bash
# Two builds of the shim side by side on the CPU: the same 4 KiB
# cudaMalloc+cudaFree pairs through the fake CUDA runtime under each,
# rounds alternating between them. Prints each build's median of ROUNDS, in
# ns/pair, and the median of the rounds' ratios (this build over the other,
# each round's two runs back to back) per option set.
#   bash scripts/hook-bench-vs.sh OTHER/libcupool.so [pairs]
# Build the other one from a worktree: git worktree add ../base REV &&
# (cd ../base && cargo build --release --lib).
set -eu
cd "$(dirname "$0")/.."
[[ -f ${1:-} ]] || { echo "usage: $0 OTHER/libcupool.so [pairs]: no such file: ${1:-}" >&2; exit 2; }
other=$(realpath "$1"); n=${2:-300000}; rounds=${ROUNDS:-5}
cargo build --release -q
cargo test --release -q --test fake_cuda >/dev/null   # builds the fake driver/runtime
fake=$(realpath --relative-to=. target/fake-cuda/current)  # the build the tests just used
cc -O2 benches/hook_pair.c -o target/hook_pair -L"$fake" -l:libcudart.so.13 -l:libcuda.so.1 -Wl,-rpath,"$PWD/$fake"
export LD_LIBRARY_PATH=$fake
this=$PWD/target/release/libcupool.so
logs=target/hook-bench-logs
nostacks=stack_depth=0:python_depth=0
printf '%-50s %10s %10s %7s\n' "options" "this" "other" "ratio"
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for o in mode=passthrough:trace=0:$nostacks mode=pool:trace=0:$nostacks mode=pool:trace=0 mode=pool:trace=1; do
  a=(); b=()
  for r in $(seq $rounds); do
    rm -rf $logs; a+=("$(CUPOOL_OPTIONS=$o:log_dir=$logs LD_PRELOAD=$this target/hook_pair $n | sed 's/.*=//')")
    rm -rf $logs; b+=("$(CUPOOL_OPTIONS=$o:log_dir=$logs LD_PRELOAD=$other target/hook_pair $n | sed 's/.*=//')")
  done
  ratios=$(for i in "${!a[@]}"; do awk -v x=${a[$i]} -v y=${b[$i]} 'BEGIN { print x / y }'; done | median)
  printf '%-50s %10s %10s %7.3f\n' "$o" "$(printf '%s\n' "${a[@]}" | median)" "$(printf '%s\n' "${b[@]}" | median)" "$ratios"
done
rm -rf $logs

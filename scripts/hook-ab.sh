#!/usr/bin/env bash
# Two builds of the shim side by side on the CPU: the hook bench's loop
# (benches/hook_pair.c, 4 KiB cudaMalloc+cudaFree through the fake runtime),
# the builds alternated run by run, ROUNDS runs each (9), every run the best of
# 5 rounds of 200,000 pairs. Prints min, median and max ns per pair per build.
#   bash scripts/hook-ab.sh OLD.so NEW.so [CUPOOL_OPTIONS]   (default: mode=pool:trace=0)
# Build the old one from a worktree, e.g.
#   git worktree add /tmp/old REV && (cd /tmp/old && cargo build --release)
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 OLD.so NEW.so [OPTIONS]" >&2; exit 2; }
old=$(realpath "$1"); new=$(realpath "$2"); opts=${3:-mode=pool:trace=0}
cd "$(dirname "$0")/.."
cargo test --release -q --test fake_cuda >/dev/null   # builds the fake driver/runtime
fake=$(realpath --relative-to=. target/fake-cuda/current)  # the build the tests just used
cc -O2 benches/hook_pair.c -o target/hook_pair -L"$fake" -l:libcudart.so.13 -l:libcuda.so.1 -Wl,-rpath,"$PWD/$fake"
export LD_LIBRARY_PATH=$fake
logs=target/hook-ab-logs; out=$(mktemp -d)
for i in $(seq "${ROUNDS:-9}"); do
  for b in old new; do
    so=$old; [ $b = new ] && so=$new
    rm -rf $logs
    CUPOOL_OPTIONS=$opts:log_dir=$logs LD_PRELOAD=$so target/hook_pair 200000 | sed 's/.*=//' >> $out/$b
  done
done
echo "options $opts, ns per pair over ${ROUNDS:-9} runs:"
for b in old new; do
  sort -n $out/$b | awk -v b=$b '{x[NR]=$1} END {printf "%-4s min %6.1f  median %6.1f  max %6.1f\n", b, x[1], x[int((NR+1)/2)], x[NR]}'
done
rm -rf $logs $out

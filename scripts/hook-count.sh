#!/usr/bin/env bash
# The hook bench's pair counted instead of timed: instructions per
# cudaMalloc(4 KiB)+cudaFree under `valgrind --tool=callgrind`, through the
# fake runtime, for each shim given. A count does not swing from run to run
# as this host's timings do (BENCHMARKS.md §12), so it can tell two builds apart
# by a few instructions. The count per pair is the difference between runs of
# 2N and N pairs (benches/hook_pair.c runs 5 rounds of each), over 5N pairs:
# start-up and exit cancel out.
#   bash scripts/hook-count.sh [OPTIONS] SHIM.so...   (OPTIONS default: mode=pool:trace=0)
# Valgrind lets a program map less address space than the VMM pool's 64 GiB
# ranges: a shim that cannot shrink its ranges (builds before 461b2b0)
# refuses every pooled allocation there, so count those with
# backing=segments. hook_pair fails (and this script with it) when any call
# is refused.
set -euo pipefail
opts=mode=pool:trace=0
case ${1:-} in *=*) opts=$1; shift ;; esac
[ $# -ge 1 ] || { echo "usage: $0 [OPTIONS] SHIM.so..." >&2; exit 2; }
command -v valgrind >/dev/null || { echo "$0: valgrind is not installed" >&2; exit 2; }
shims=(); for so in "$@"; do shims+=("$(realpath "$so")"); done
cd "$(dirname "$0")/.."
cargo test --release -q --test fake_cuda >/dev/null   # builds the fake driver/runtime
fake=$(realpath --relative-to=. target/fake-cuda/current)  # the build the tests just used
cc -O2 benches/hook_pair.c -o target/hook_pair -L"$fake" -l:libcudart.so.13 -l:libcuda.so.1 -Wl,-rpath,"$PWD/$fake"
export LD_LIBRARY_PATH=$fake
n=${PAIRS:-20000}
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
count() { # SHIM PAIRS -> instructions of the whole run
  CUPOOL_OPTIONS=$opts:log_dir=$w/logs LD_PRELOAD=$1 \
    valgrind --tool=callgrind --callgrind-out-file="$w/out" target/hook_pair "$2" >/dev/null 2>"$w/err" ||
    { echo "$0: the bench failed under $1:" >&2; grep -v '^==' "$w/err" >&2; exit 1; }
  grep -o 'Collected : [0-9]*' "$w/err" | sed 's/.* //'
}
echo "options $opts, instructions per pair (runs of $((2 * n)) and $n pairs):"
for so in "${shims[@]}"; do
  small=$(count "$so" "$n"); big=$(count "$so" $((2 * n)))
  printf '%-60s %d\n' "$so" $(((big - small) / (5 * n)))
done

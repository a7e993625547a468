#!/usr/bin/env bash
# How long cupool report (text, --json, --html) and cupool export take on a log of about a million
# events, on one core (taskset -c 0), no GPU needed. The log is a real one:
# tests/fake/check_loop.c run under the shim against the fake CUDA runtime
# (built by the test suite), 167,000 steps of a training loop that names each
# step with cupool_mark and keeps a queue of batches of varying sizes (about 6
# events a step: 2 phase edges, 2 to 4 allocations and frees). Also gzipped.
# Prints the best of 3 runs of each command, in seconds.
#   scripts/views-bench.sh [STEPS]
set -eu
cd "$(dirname "$0")/.."
steps=${1:-167000}
cargo build --release -q -p cupool -p cupool-cli
cargo test --release -q --test fake_cuda >/dev/null   # builds the fake driver/runtime
fake=$(realpath --relative-to=. target/fake-cuda/current)  # the build the tests just used
out=target/views-bench
rm -rf "$out" && mkdir -p "$out/logs"
cc -O2 -Itests/fake tests/fake/check_loop.c -o "$out/check_loop" -L"$fake" -l:libcudart.so.13 \
   -Wl,-rpath,"$PWD/$fake" -ldl
LD_LIBRARY_PATH=$fake LD_PRELOAD=$PWD/target/release/libcupool.so CUPOOL_OPTIONS=log_dir=$out/logs \
  "$out/check_loop" "$steps" wave mark >/dev/null
log=$(ls "$out"/logs/cupool.*.json)
gzip -k "$log"
events=$(grep -c '"ev":' "$log")
printf '%s: %d events, %s MB (%s MB gzipped)\n' "$log" "$events" \
  "$(( $(stat -c %s "$log") / 1000000 ))" "$(( $(stat -c %s "$log.gz") / 1000000 ))"
cupool=target/release/cupool
best() {  # best of 3 wall-clock times of "$@", stdout discarded
  local b=
  for _ in 1 2 3; do
    local s e t
    s=$(date +%s.%N); taskset -c 0 "$@" >/dev/null 2>&1 || true; e=$(date +%s.%N)
    t=$(echo "$e - $s" | bc)
    if [ -z "$b" ] || [ "$(echo "$t < $b" | bc)" = 1 ]; then b=$t; fi
  done
  printf '%.2f' "$b"
}
printf '%-58s %s s\n' "cupool report (text)" "$(best $cupool report "$log")"
printf '%-58s %s s\n' "cupool report --json" "$(best $cupool report --json "$log")"
printf '%-58s %s s\n' "cupool report (text), gzipped log" "$(best $cupool report "$log.gz")"
printf '%-58s %s s\n' "cupool report --html" "$(best $cupool report --html "$out/report.html" "$log")"
printf '%-58s %s s\n' "cupool export --perfetto" "$(best $cupool export --perfetto "$out/trace.json" "$log")"
printf '%-58s %s s\n' "cupool export --memory-viz" "$(best $cupool export --memory-viz "$out/snap.pickle" "$log")"
ls -la "$out/report.html" "$out/trace.json" "$out/snap.pickle" | awk '{print $5, $9}'

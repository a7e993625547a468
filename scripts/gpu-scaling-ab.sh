#!/usr/bin/env bash
# Thread scaling of two builds side by side on one host: scripts/gpu-scaling.sh
# for the shim in .gpu/old/libcupool.so (an earlier build) and the one in
# .gpu/libcupool.so, alternated PASSES times (2 unless set) in the order old,
# new, new, old, ... so that drift over the run weighs on both alike. Each
# pass runs THREADS ("1 8" unless set) for ROUNDS rounds (3 unless set) and
# prints its tables from the medians on, headed by the build and the pass;
# each pass's whole output stays in $OUT (or a temporary folder). Last, the
# 8-thread rows of every pass side by side, by row name.
# Then, unless SAFETY=0, the magazine safety and stress runs of
# scripts/gpu-threads.sh on the new build. Run from the repository root on
# the GPU.
set -u
root=$(pwd); out=${OUT:-$(mktemp -d /tmp/scab.XXXX)}
[ -f $root/.gpu/old/libcupool.so ] && [ -f $root/.gpu/libcupool.so ] ||
  { echo "$0: needs .gpu/old/libcupool.so and .gpu/libcupool.so" >&2; exit 2; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
order="old new"
for pass in $(seq ${PASSES:-2}); do
  for b in $order; do
    lib=$root/.gpu/libcupool.so; [ $b = old ] && lib=$root/.gpu/old/libcupool.so
    echo "== $b build, pass $pass"
    SHIM=$lib THREADS=${THREADS:-1 8} ROUNDS=${ROUNDS:-3} bash $root/scripts/gpu-scaling.sh > $out/scaling-$b-$pass.txt 2>&1
    sed -n '/^medians/,$p' $out/scaling-$b-$pass.txt
  done
  order=$(echo $order | awk '{print $2, $1}')
done
# Every pass's 8-thread rows side by side (the medians table's columns).
echo "== 8 threads, every pass: build pass name threads M-pairs/s x-1-thread CPU-ns x-1-thread /control best:/control by-round:/control (range)"
for f in $out/scaling-*-*.txt; do
  b=$(basename $f .txt); b=${b#scaling-}
  awk -v tag="${b%-*} ${b#*-}" '/^medians/ {on = 1; next} on && NF == 10 && $2 == 8 {print tag, $0} /^time/ {on = 0}' $f
done | sort -k3,3 -k1,1 -k2n
if [ "${SAFETY:-1}" != 0 ]; then
  echo "== magazine safety and stress, new build"
  SECTIONS="safety stress" bash $root/scripts/gpu-threads.sh > $out/threads.txt 2>&1
  sed -n '/^== table/,$p' $out/threads.txt
fi

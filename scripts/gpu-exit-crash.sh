#!/usr/bin/env bash
# Whose crash is it? numba-cuda's suite (the modules scripts/gpu-suites.sh
# runs) POOL times under cupool (5) and PLAIN times without it (3), all at
# once on one GPU, each with a preloaded backtracer (scripts/gpu/segv_bt.c)
# that prints the native stack of a SIGSEGV/SIGBUS/SIGABRT as module+offset.
# Made when one pool run of that suite exited 139 where the plain run exited
# 1: a crash seen plainly too is the program's. Run from the repository root
# on the GPU, with the CLI and shim in .gpu/ (and .gpu/pywheels/ as for
# gpu-suites.sh):   POOL=6 PLAIN=3 bash scripts/gpu-exit-crash.sh
set -u
root=$(pwd); bin=$root/.gpu; w=$(mktemp -d /tmp/cupool-crash.XXXX)
out=${OUT:-$w}
source $root/scripts/gpu/suite_common.sh
install_carried_wheels $bin/pywheels $w/py
export PYTHONPATH=$root/scripts/gpu/plugins:$w/py
gcc -O1 -shared -fPIC -o $w/segv_bt.so $root/scripts/gpu/segv_bt.c
args=(-m pytest -q -p no:cacheprovider --rootdir=. --timeout=60 "${numba_cuda_pytest_args[@]}")
cd $w
for i in $(seq ${POOL:-5}); do
  (mkdir -p $w/pool$i && cd $w/pool$i && $bin/cupool run --log-dir $w/pool$i/logs -- env LD_PRELOAD=$w/segv_bt.so:$bin/libcupool.so python3 "${args[@]}" > out 2>&1; echo $? > rc) &
done
for i in $(seq ${PLAIN:-3}); do
  (mkdir -p $w/plain$i && cd $w/plain$i && env LD_PRELOAD=$w/segv_bt.so python3 "${args[@]}" > out 2>&1; echo $? > rc) &
done
wait
for d in $w/pool* $w/plain*; do
  echo "$(basename $d) rc=$(cat $d/rc) $(grep -E '^[0-9]+ failed' $d/out | tail -1)"
  grep -A45 "=== segv_bt" $d/out | head -50
done
tar czf $out/many.tgz -C $w $(cd $w; ls -d pool* plain*) 2>/dev/null

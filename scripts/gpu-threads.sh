#!/usr/bin/env bash
# Threads allocating at once, on the GPU: throughput and safety of thread
# magazines, with the shim in .gpu/ and, when .gpu/old/libcupool.so exists
# (an earlier build), that one interleaved beside it.
#  1. scaling: pairs/s of cudaMalloc(4 KiB)+cudaFree from 1, 2, 4 and 8
#     threads, each on its own non-blocking stream, without and with a kernel
#     per pair (scripts/gpu/scaling.cu), best of 3, sites off and default;
#  2. magazine safety: a thread's freed block taken back before the GPU work
#     queued before its free finished would be caught (magazine_safety.cu),
#     plainly, with magazines=auto and =always, and (when
#     .gpu/broken/libcupool.so exists: a build that ignores fences, to show
#     the test catches what it looks for) that build;
#  3. the 8-thread stress (10^6 operations) and the stream-safety test under
#     the new build, default options and magazines=always.
# SECTIONS (default "scaling safety stress") picks among the three.
# Prints a table last. Run from the repository root on the GPU machine.
set -u
export PATH=/usr/local/cuda/bin:$PATH
root=$(pwd); src=$root/scripts/gpu; w=$(mktemp -d /tmp/cupool-threads.XXXX)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for p in scaling magazine_safety stress stream_safety; do
  nvcc -O2 -arch=native -cudart shared -o $w/$p $src/$p.cu || exit 1
done
new=$root/.gpu/libcupool.so; old=$root/.gpu/old/libcupool.so; broken=$root/.gpu/broken/libcupool.so
builds="new"; [ -f $old ] && builds="old new"
under() { # under LIB OPTIONS CMD...: the command with the shim preloaded
  local lib=$1 opts=$2; shift 2
  CUPOOL_OPTIONS=$opts:log_dir=$w/logs LD_PRELOAD=$lib "$@"
}
best() { # best LIB OPTIONS CMD...: best pairs/s of 3 runs
  for r in 1 2 3; do under "$@" | sed -n 's/.*pairs_per_s=\([0-9]*\).*/\1/p'; done | sort -n | tail -1
}
nost=stack_depth=0:python_depth=0
sections=" ${SECTIONS:-scaling safety stress} "
: > $w/table.txt
if [[ $sections == *" scaling "* ]]; then
echo "== scaling" | tee -a $w/table.txt
printf '%-7s %-8s %-6s %8s %8s %8s %8s\n' kernel options build 1 2 4 8 | tee -a $w/table.txt
for kernel in 0 1; do
  pairs=100000; [ $kernel = 1 ] && pairs=20000
  for opts in trace=0:$nost trace=0; do
    for b in $builds; do
      lib=$new; [ $b = old ] && lib=$old
      row=""
      for t in 1 2 4 8; do row="$row $(best $lib $opts $w/scaling $t $pairs $kernel)"; done
      name=default; [ $opts != trace=0 ] && name=sites-off
      printf '%-7s %-8s %-6s %8s %8s %8s %8s\n' $kernel $name $b $row | tee -a $w/table.txt
    done
  done
done
fi
if [[ $sections == *" safety "* ]]; then
echo "== magazine safety (4 threads, 2000 rounds; 16 KiB blocks)" | tee -a $w/table.txt
echo "plain:            $($w/magazine_safety 4 2000 | grep result)" | tee -a $w/table.txt
echo "magazines=auto:   $(under $new trace=0 $w/magazine_safety 4 2000 | grep result)" | tee -a $w/table.txt
echo "magazines=always: $(under $new trace=0:magazines=always $w/magazine_safety 4 2000 | grep result)" | tee -a $w/table.txt
[ -f $broken ] && echo "fences ignored (a broken build, =always): $(under $broken trace=0:magazines=always $w/magazine_safety 4 2000 | grep result)" | tee -a $w/table.txt
fi
if [[ $sections == *" stress "* ]]; then
echo "== stress and stream safety (new build)" | tee -a $w/table.txt
for opts in trace=0 trace=0:magazines=always; do
  s=$( { /usr/bin/time -f "%e s" bash -c "CUPOOL_OPTIONS=$opts:log_dir=$w/logs LD_PRELOAD=$new $w/stress 1000000" ; } 2>&1 | tr '\n' ' ')
  echo "stress $opts: $s" | tee -a $w/table.txt
  echo "stream safety $opts: $(under $new $opts $w/stream_safety | tail -1)" | tee -a $w/table.txt
done
fi
echo; echo "== table"; cat $w/table.txt

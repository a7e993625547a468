#!/usr/bin/env bash
# compute-sanitizer through the pool (issue 11, "tools see through the pool"):
# scripts/gpu/sanitizer_pool.cu, built with shared and static cudart, runs
# under `compute-sanitizer --tool memcheck --leak-check full` plainly and with
# the shim preloaded in pool mode. The pool must not hide what the sanitizer
# finds plainly: the write one past a pooled block, the leaked block with its
# own size, and nothing at all for the clean program. Same setup as
# scripts/gpu-check.sh (.gpu/ holds the shim); prints a table last
# (BENCHMARKS.md, section 8).
set -u
export PATH=/usr/local/cuda/bin:$PATH
root=$(pwd); bin=$root/.gpu; src=$root/scripts/gpu; work=$(mktemp -d /tmp/cupool-sanitizer.XXXX)
out=${OUT:-$work}
compute-sanitizer --version | tail -n 1
nvcc -O2 -arch=native -cudart shared -o $work/shared $src/sanitizer_pool.cu &
nvcc -O2 -arch=native -o $work/static $src/sanitizer_pool.cu &
wait
[ -x $work/shared ] && [ -x $work/static ] || exit 1
# --nvtx yes: the sanitizer takes NVTX annotations only when asked (its
# NvtxMemoryPool sample passes it). --destroy-on-device-error kernel: the oob
# program goes on past the bad kernel and frees its buffers, so its report is
# the bad write alone.
san=(compute-sanitizer --tool memcheck --leak-check full --destroy-on-device-error kernel)

# sanitize NAME BUILD MODE plain|pool [yes|no: --nvtx, default yes]
sanitize() {
  local name=$1 build=$2 mode=$3 how=$4 nvtx=${5:-yes}
  if [ "$how" = pool ]; then
    env LD_PRELOAD=$bin/libcupool.so CUPOOL_OPTIONS=mode=pool:log_dir=$work/logs-$name:verbosity=2 \
      timeout 110 "${san[@]}" --nvtx $nvtx $work/$build $mode > $work/$name.txt 2>&1
  else
    timeout 110 "${san[@]}" --nvtx $nvtx $work/$build $mode > $work/$name.txt 2>&1
  fi
  echo "rc=$?" >> $work/$name.txt
}

# What one report says: errors, bad writes, leaked sizes (sorted).
summary() {
  local f=$work/$1.txt
  local errors oob leaks
  errors=$(grep -oE 'ERROR SUMMARY: [0-9]+' $f | grep -oE '[0-9]+$' | tail -n 1)
  oob=$(grep -cE 'Invalid __global__ (write|access)' $f)
  leaks=$(grep -oE 'Leaked [0-9,]+ bytes' $f | grep -oE '[0-9,]+' | tr -d , | sort -n | paste -sd, -)
  echo "errors=${errors:-?} oob=$oob leaks=[${leaks}]"
}

# Every run at once (the GPU has room; the sanitizer's start-up dominates).
for build in shared static; do
  for mode in oob leak clean; do
    sanitize $mode-$build-plain $build $mode plain &
    sanitize $mode-$build-pool $build $mode pool &
  done
done
# Is --nvtx yes needed? The oob case under the pool without it.
sanitize oob-shared-pool-no-nvtx-flag shared oob pool no &
wait
rows=()
for build in shared static; do
  for mode in oob leak clean; do
    p=$(summary $mode-$build-plain); q=$(summary $mode-$build-pool)
    # The pool's report must be the plain one, and that must hold the planted error.
    case $mode in
      oob)   want='oob=[1-9]' ;;
      leak)  want='leaks=\[[0-9]' ;;
      clean) want='^errors=0 oob=0 leaks=\[\]$' ;;
    esac
    [[ $p == "$q" && $p =~ $want ]] && v=PASS || v=FAIL
    grep -q "registered with the NVTX tool's memory API" $work/$mode-$build-pool.txt || v="$v (no NVTX tool attached)"
    rows+=("$(printf '| %-6s | %-5s | %-40s | %-40s | %s |' $mode $build "$p" "$q" "$v")")
  done
done
extra="oob shared pool with --nvtx no: $(summary oob-shared-pool-no-nvtx-flag)"

tar czf $out/gpu-sanitizer-logs.tgz -C $work . 2>/dev/null
for f in oob-shared-pool leak-shared-pool clean-shared-pool leak-shared-plain; do
  echo "== $f"; grep -v '^=========     ' $work/$f.txt | head -n 30
done
echo
echo "$extra"
echo "| mode   | cudart | compute-sanitizer, plain                  | compute-sanitizer, cupool pool mode       | verdict |"
echo "|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"

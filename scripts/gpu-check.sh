#!/usr/bin/env bash
# Shows cupool's interception on a real GPU: every case runs the same program
# plainly and under the shim, and compare.py checks cupool's log against the
# program's own counts and compute-sanitizer's leak report. Run on a machine with a GPU,
# from the repository root, with the built shim and CLI in .gpu/:
#   cargo build --release && mkdir -p .gpu && cp target/release/{libcupool.so,cupool} .gpu/
#   (and the wheel: maturin build --release && cp target/wheels/cupool-*.whl .gpu/)
#   bash scripts/gpu-check.sh            (prints a table last; ends with scripts/gpu-multi.sh,
#                                         the two-GPU section, skipped with one GPU)
set -u
export PATH=/usr/local/cuda/bin:$PATH
root=$(pwd)
bin=$root/.gpu
work=$(mktemp -d /tmp/cupool-gpu.XXXX)
out=${OUT:-$work}
src=$root/scripts/gpu
rows=()
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
nvcc --version | tail -1

build() { nvcc -O2 -arch=native "$@" 2>&1 | grep -v "^$" >&2; }
build -cudart shared -o $work/leaks_shared $src/leaks.cu -lcuda
build -o $work/leaks_static $src/leaks.cu -lcuda
build -o $work/driver $src/driver.cu -lcuda
build -cudart shared -default-stream per-thread -o $work/leaks_ptds $src/leaks.cu -lcuda
build -cudart shared -o $work/reset $src/reset.cu
build -o $work/reset_static $src/reset.cu
build -cudart shared -o $work/limit_shared $src/limit.cu -lcuda
build -o $work/limit_static $src/limit.cu -lcuda
build -cudart shared -o $work/ipc $root/tests/fake/ipc_blocks.c -lcuda
build -o $work/ptr_query $src/ptr_query.cu -lcuda
build -cudart shared -o $work/oom_other $src/oom_other.cu
build -cudart shared -o $work/free_then_async $src/free_then_async.cu
build -x cu -I$root/tests/fake -cudart shared -o $work/last_error_shared $root/tests/fake/last_error.c
build -x cu -I$root/tests/fake -o $work/last_error_static $root/tests/fake/last_error.c
echo "static cudart has no dynamic cudaMalloc: $(nm -D $work/leaks_static | grep -c ' cudaMalloc$') symbols"

# case NAME [--sanitize] -- CMD...
run_case() {
  local name=$1; shift
  local sanitize=0
  if [ "$1" = --sanitize ]; then sanitize=1; shift; fi
  shift # --
  local d=$work/$name; mkdir -p $d/logs
  local t0=$(date +%s.%N)
  "$@" >$d/plain.out 2>$d/plain.err; local rc_plain=$?
  local t1=$(date +%s.%N)
  $bin/cupool run ${CUPOOL_FLAGS:-} --log-dir $d/logs -- "$@" >$d/shim.out 2>$d/shim.err; local rc_shim=$?
  local t2=$(date +%s.%N)
  local san=()
  if [ $sanitize = 1 ]; then
    compute-sanitizer --leak-check full "$@" >$d/sanitizer.out 2>&1
    san=($d/sanitizer.out)
  fi
  local row
  row=$(python3 $src/compare.py $name $d/logs $d/plain.out $d/shim.out "${san[@]}")
  [ $rc_plain = $rc_shim ] || row="$row rc_plain=$rc_plain rc_shim=$rc_shim (EXIT STATUS DIFFERS)"
  rows+=("$row $(python3 -c "print(f'plain={$t1-$t0:.1f}s shim={$t2-$t1:.1f}s')")")
  tail -n 12 $d/shim.err | sed "s/^/[$name] /" >&2
}

run_case cudart-shared --sanitize -- $work/leaks_shared
run_case cudart-static --sanitize -- $work/leaks_static
run_case driver-api --sanitize -- $work/driver
run_case cudart-per-thread --sanitize -- $work/leaks_ptds
run_case device-reset --sanitize -- $work/reset
run_case device-reset-static --sanitize -- $work/reset_static
PYTORCH_NO_CUDA_MEMORY_CACHING=1 run_case torch-no-caching -- python3 $src/torch_count.py
run_case torch-caching -- python3 $src/torch_count.py
run_case cupy -- python3 $src/cupy_count.py
XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_ALLOCATOR=platform run_case jax-platform -- python3 $src/jax_count.py
run_case jax-default -- python3 $src/jax_count.py
# The same checks with cupool only observing (the rows above run in pool mode, the default).
CUPOOL_FLAGS="--mode passthrough" run_case passthrough-cudart-shared --sanitize -- $work/leaks_shared
CUPOOL_FLAGS="--mode passthrough" run_case passthrough-cudart-static --sanitize -- $work/leaks_static
CUPOOL_FLAGS="--mode passthrough" run_case passthrough-driver-api --sanitize -- $work/driver
PYTORCH_NO_CUDA_MEMORY_CACHING=1 CUPOOL_FLAGS="--mode passthrough" run_case passthrough-torch-no-caching -- python3 $src/torch_count.py
CUPOOL_FLAGS="--mode passthrough" run_case passthrough-cupy -- python3 $src/cupy_count.py

# The memory cap means one thing in both modes, for the runtime and the driver API.
expect="result: total_mib=64 a=0 b=2 driver=2 near_cap=0 wrote=1"
for mode in passthrough pool; do
  for prog in limit_shared limit_static; do
    got=$($bin/cupool run -q --log-dir $work/$mode-$prog --limit 64m --mode $mode -- $work/$prog | grep '^result:')
    rows+=("$(printf '%-22s' "limit-$mode-${prog#limit_}") | $([ "$got" = "$expect" ] && echo PASS || echo FAIL)                                     | $got")
  done
done

# Pointer queries answer per pooled block exactly as the driver answers per allocation.
plain=$($work/ptr_query | grep '^result:')
pooled=$($bin/cupool run -q --log-dir $work/ptr-query --mode pool -- $work/ptr_query | grep '^result:')
rows+=("ptr-query-pool         | $([ -n "$plain" ] && [ "$plain" = "$pooled" ] && echo PASS || echo FAIL)                                     | pool: ${pooled#result: } (plain: ${plain#result: })")

# A request larger than the device fails as without cupool and holds nothing after:
# CUDA's own pool then gets half the device, and the pool's reserved peak stays small.
plain=$($work/oom_other | grep '^result:')
pooled=$($bin/cupool run -q --log-dir $work/oom-other -- $work/oom_other | grep -E '^(result|times):' | tr '\n' ' ')
peak=$(python3 -c "import json,glob; l=json.load(open(glob.glob('$work/oom-other/latest/cupool.*.json')[0])); print(max(p['reserved_bytes']['peak'] for p in l['end']['pools']) >> 20)" 2>/dev/null)
rows+=("oom-then-other         | $([ -n "$plain" ] && [ "${pooled%% times:*}" = "$plain" ] && [ -n "$peak" ] && [ "$peak" -lt 1024 ] && echo PASS || echo FAIL)                                     | pool: $pooled reserved peak ${peak}MiB (plain: ${plain#result: })")

# An error the pool answers itself (a double free, a full device, a free a
# capture refuses) is the thread's last error too, as plainly.
for rt in shared static; do
  plain=$($work/last_error_$rt | tr '\n' ' ')
  pooled=$($bin/cupool run -q --log-dir $work/last-error-$rt -- $work/last_error_$rt | tr '\n' ' ')
  rows+=("$(printf '%-22s' last-error-$rt) | $([ -n "$plain" ] && [ "$pooled" = "$plain" ] && echo PASS || echo FAIL)                                     | pool: $pooled (plain: $plain)")
done

# Memory freed behind fences is there for CUDA's own pool, as after a plain cudaFree
# (every request pooled: from 1 GiB up they would go to CUDA as they are).
plain=$($work/free_then_async | grep '^result:')
pooled=$($bin/cupool run -q --log-dir $work/free-then-async -o direct_min=0 -- $work/free_then_async | grep '^result:')
rows+=("free-then-async        | $([ -n "$plain" ] && [ "$plain" = "$pooled" ] && echo PASS || echo FAIL)                                     | pool: ${pooled#result: } (plain: ${plain#result: })")

# IPC: a receiver sees each block's own bytes, or (outside cupool) an error.
for backing in segments vmm; do
  while read -r line; do
    rows+=("$(printf '%-22s' "ipc-$(echo "$line" | awk '{print ($2 == "segments" ? "" : $2 "-") $3}')") | $(echo "$line" | grep -q 'ok=1' && echo PASS || echo FAIL)                                     | ${line#result: }")
  done < <(timeout 180 python3 $src/ipc_check.py $work/ipc $bin/cupool $work/ipc-logs-$backing $backing | grep '^result:')
done
# The receiver closes its blocks during a relaxed capture of its own: the
# capture stays whole and the closed blocks are gone after it, as plainly.
while read -r line; do
  ok=$(echo "$line" | grep 'ok=1' | grep -v 'capture_end=[1-9]' | grep -vc 'range_after_close=still')
  rows+=("$(printf '%-22s' "ipc-vmm-capture-$(echo "$line" | awk '{print $3}')") | $([ "$ok" = 1 ] && echo PASS || echo FAIL)                                     | ${line#result: }")
done < <(IPC_CLOSE_IN_CAPTURE=1 timeout 180 python3 $src/ipc_check.py $work/ipc $bin/cupool $work/ipc-logs-capture vmm | grep '^result:')
# PyTorch shares CUDA tensors only with its caching allocator on: without it,
# `_share_cuda_` raises "invalid device pointer" with or without cupool.
for mode in passthrough pool; do
  got=$(timeout 120 $bin/cupool run -q --log-dir $work/torch-ipc-$mode --mode $mode -- python3 $src/torch_ipc.py 2>&1 | grep '^result:')
  rows+=("$(printf '%-22s' "torch-ipc-$mode") | $(echo "$got" | grep -q 'ok=1' && echo PASS || echo FAIL)                                     | $got")
done

# cupool's own C API (what the Python module reads), in both modes.
for mode in passthrough pool; do
  got=$($bin/cupool run -q --log-dir $work/stats-$mode --mode $mode -- python3 $src/torch_stats.py | grep '^result:')
  rows+=("$(printf '%-22s' "memory-stats-$mode") | $(echo "$got" | grep -q 'ok=1' && echo PASS || echo FAIL)                                     | $got")
done

# PyTorch's NVTX ranges become phases (cupool run makes the shim the NVTX tool).
got=$(PYTORCH_NO_CUDA_MEMORY_CACHING=1 $bin/cupool run -q --log-dir $work/nvtx --mode pool -- python3 $src/torch_nvtx.py 2>&1 | grep '^result:')
phases=$(python3 -c "import json,glob; l=json.load(open(glob.glob('$work/nvtx/latest/cupool.*.json')[0])); print([(e['ev'][6:], e['name'], e['live'] >> 20) for e in l['events'] if e.get('ev', '').startswith('phase_')])" 2>&1)
want="[('begin', 'epoch 0', 0), ('begin', 'inner', 16), ('end', 'inner', 24), ('end', 'epoch 0', 16), ('begin', 'epoch 1', 0), ('begin', 'inner', 16), ('end', 'inner', 24), ('end', 'epoch 1', 16)]"
rows+=("torch-nvtx             | $([ "$phases" = "$want" ] && echo PASS || echo FAIL)                                     | phases (edge, name, MiB live)=$phases")

# The pip wheel (carried in .gpu/), installed with pip into a directory of its
# own beside the machine's PyTorch environment (a fresh venv made from that
# environment's python would not see PyTorch): its cupool command and Python
# module, phases in the log.
if ls $bin/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target $work/wheel $bin/*.whl 2>/dev/null
  for mode in passthrough pool; do
    got=$(PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$work/wheel $work/wheel/bin/cupool run -q --log-dir $work/module-$mode --mode $mode -- python3 $src/torch_module.py 2>&1 | grep '^result:')
    phases=$(python3 -c "import json,glob; l=json.load(open(glob.glob('$work/module-$mode/latest/cupool.*.json')[0])); print(sorted({(e['ev'], e['name']) for e in l['events'] if e.get('ev', '').startswith('phase_')}))" 2>&1)
    want="[('phase_begin', 'epoch 0'), ('phase_begin', 'epoch 1'), ('phase_begin', 'warm-up'), ('phase_end', 'epoch 0'), ('phase_end', 'warm-up')]"
    verdict=$([ "$phases" = "$want" ] && echo "$got" | grep -q 'ok=1' && echo PASS || echo FAIL)
    rows+=("$(printf '%-22s' "wheel-module-$mode") | $verdict                                     | $got phases=$phases")
  done
else
  rows+=("wheel-module           | SKIPPED (no wheel in .gpu/)                  |")
fi

# Exit status and signals through the CLI.
$bin/cupool run -q --log-dir $work/status -- python3 -c "import torch; torch.zeros(1, device='cuda'); import sys; sys.exit(7)"
rows+=("exit-status            | $([ $? = 7 ] && echo PASS || echo FAIL)                                     | cupool run returned the program's 7")
$bin/cupool run -q --log-dir $work/term -- python3 -c "import torch,os,signal; torch.zeros(1, device='cuda'); os.kill(os.getpid(), signal.SIGTERM)"
rc=$?
rows+=("sigterm                | $([ $rc = 143 ] && python3 -c "import json,glob,sys; l=json.load(open(glob.glob('$work/term/latest/cupool.*.json')[0])); sys.exit(0 if l['end']['exit']['name']=='SIGTERM' else 1)" && echo PASS || echo FAIL)                                     | rc=$rc, log ends with exit.signal SIGTERM")

# Two GPUs: peer access, NCCL, torchrun with NCCL and one verdict per job
# (scripts/gpu-multi.sh prints a line and nothing else with fewer than two
# GPUs). MULTI_PARTS picks its parts (default: all of them).
multi_rows=$(OUT=$out bash $root/scripts/gpu-multi.sh ${MULTI_PARTS:-} 2>&1 | tee $work/multi.out | grep -E '^[a-z0-9-]+ +\| (PASS|FAIL|MISS|SKIP)|^two-GPU section skipped')
while read -r line; do [ -n "$line" ] && rows+=("$line"); done <<< "$multi_rows"
[ -n "$multi_rows" ] || rows+=("two-GPU section         | FAIL | scripts/gpu-multi.sh printed no row (see $work/multi.out)")

cp -r $work/*/shim.err $out/ 2>/dev/null
tar czf $out/gpu-check-logs.tgz -C $work . 2>/dev/null
echo
echo "case                   | verdict                                  | figures"
printf '%s\n' "${rows[@]}"

#!/usr/bin/env bash
# The GPU check's cases for the pool's per-block behaviour (memory cap,
# pointer queries, IPC), NVTX phases and the wheel's Python module, plus one
# leak case per runtime: a quick re-check after a change to those parts.
# Same setup as scripts/gpu-check.sh (.gpu/ with the shim, the CLI, the wheel).
set -u
export PATH=/usr/local/cuda/bin:$PATH
root=$(pwd); bin=$root/.gpu; src=$root/scripts/gpu; work=$(mktemp -d /tmp/cupool-quick.XXXX)
build() { nvcc -O2 -arch=native "$@" 2>&1 | grep -v "^$" >&2; }
build -cudart shared -o $work/leaks_shared $src/leaks.cu -lcuda
build -o $work/leaks_static $src/leaks.cu -lcuda
build -cudart shared -o $work/limit $src/limit.cu -lcuda
build -o $work/ptr_query $src/ptr_query.cu -lcuda
build -cudart shared -o $work/ipc $root/tests/fake/ipc_blocks.c -lcuda
rows=()
row() { rows+=("$(printf '%-24s | %-4s | %s' "$1" "$2" "$3")"); }
for prog in leaks_shared leaks_static; do
  plain=$($work/$prog | grep '^result:'); pooled=$($bin/cupool run -q --log-dir $work/l-$prog --mode pool -- $work/$prog | grep '^result:')
  row "pool-$prog" "$([ -n "$plain" ] && [ "$plain" = "$pooled" ] && echo PASS || echo FAIL)" "$pooled"
done
for mode in passthrough pool; do
  got=$($bin/cupool run -q --log-dir $work/lim-$mode --limit 64m --mode $mode -- $work/limit | grep '^result:')
  row "limit-$mode" "$([ "$got" = "result: total_mib=64 a=0 b=2 driver=2 near_cap=0 wrote=1" ] && echo PASS || echo FAIL)" "$got"
done
plain=$($work/ptr_query | grep '^result:'); pooled=$($bin/cupool run -q --log-dir $work/pq --mode pool -- $work/ptr_query | grep '^result:')
row ptr-query-pool "$([ -n "$plain" ] && [ "$plain" = "$pooled" ] && echo PASS || echo FAIL)" "${pooled#result: }"
for backing in segments vmm; do
  while read -r line; do
    row "ipc-$(echo "$line" | awk '{print ($2 == "segments" ? "" : $2 "-") $3}')" "$(echo "$line" | grep -q 'ok=1' && echo PASS || echo FAIL)" "${line#result: }"
  done < <(timeout 150 python3 $src/ipc_check.py $work/ipc $bin/cupool $work/ipc-logs-$backing $backing | grep '^result:')
done
got=$(timeout 120 $bin/cupool run -q --log-dir $work/tipc --mode pool -- python3 $src/torch_ipc.py 2>&1 | grep '^result:')
row torch-ipc-pool "$(echo "$got" | grep -q 'ok=1' && echo PASS || echo FAIL)" "$got"
PYTORCH_NO_CUDA_MEMORY_CACHING=1 $bin/cupool run -q --log-dir $work/nvtx --mode pool -- python3 $src/torch_nvtx.py >/dev/null 2>&1
phases=$(python3 -c "import json,glob; l=json.load(open(glob.glob('$work/nvtx/latest/cupool.*.json')[0])); print([(e['ev'][6:], e['name'], e['live'] >> 20) for e in l['events'] if e.get('ev', '').startswith('phase_')])" 2>&1)
want="[('begin', 'epoch 0', 0), ('begin', 'inner', 16), ('end', 'inner', 24), ('end', 'epoch 0', 16), ('begin', 'epoch 1', 0), ('begin', 'inner', 16), ('end', 'inner', 24), ('end', 'epoch 1', 16)]"
row torch-nvtx "$([ "$phases" = "$want" ] && echo PASS || echo FAIL)" "$phases"
python3 -m pip install -q --no-index --no-deps --target $work/wheel $bin/*.whl 2>/dev/null
got=$(PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$work/wheel $work/wheel/bin/cupool run -q --log-dir $work/module --mode pool -- python3 $src/torch_module.py 2>&1 | grep '^result:')
row wheel-module-pool "$(echo "$got" | grep -q 'ok=1' && echo PASS || echo FAIL)" "$got"
echo; printf '%s\n' "${rows[@]}"

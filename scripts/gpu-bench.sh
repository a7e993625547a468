#!/usr/bin/env bash
# Side-by-side GPU benchmarks, one run, one machine (figures go to BENCHMARKS.md):
#  1. cudaMalloc+cudaFree pair latency per size: plain vs cupool (pool, no trace; pool, traced; passthrough)
#  2. the PyTorch transformer workload: caching allocator, expandable_segments,
#     PYTORCH_NO_CUDA_MEMORY_CACHING=1 raw, and the same under cupool's pool
#  3. stream safety: a freed block still written by a slow kernel on another stream; and
#     one freed before the first stream existed, still written on the legacy stream
#  4. allocation traces for `cupool replay` (recorded in passthrough mode), written to $OUT
#  5. scaling: pairs per second over 1, 2, 4 and 8 threads, each on its own stream
#  6. the cost of allocation sites: the transformer with PyTorch's cache off under
#     cupool's pool, stacks (native + Python) on vs off, beside the caching allocator
#  7. vmm: issue 12's side-by-side figures, from scripts/gpu-vmm.sh: the transformer's peak
#     driver-used memory (nvidia-smi sampled every 20 ms) and ms/iter for PyTorch's caching
#     allocator, expandable_segments and PyTorch without its cache under cupool's VMM pool,
#     ROUNDS alternating rounds (3); and the workload that fragments the caching allocator
#     into an out-of-memory error under a 10 GiB cap
# Run from the repository root with the built shim and CLI in .gpu/.
# SECTIONS="pair torch safety stress scaling traces sites vmm" (the default: all) picks sections.
set -u
export PATH=/usr/local/cuda/bin:$PATH
bin=$(pwd)/.gpu
src=$(pwd)/scripts/gpu
work=$(mktemp -d /tmp/cupool-bench.XXXX)
out=${OUT:-$work}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nvcc -O2 -arch=native -cudart shared -o $work/bench_pair $src/bench_pair.cu
nvcc -O2 -arch=native -cudart shared -o $work/stream_safety $src/stream_safety.cu
nvcc -O2 -arch=native -cudart shared -o $work/first_stream $src/first_stream.cu
nvcc -O2 -arch=native -cudart shared -o $work/stress $src/stress.cu
nvcc -O2 -arch=native -cudart shared -o $work/scaling $src/scaling.cu
pool="$bin/cupool run -q --log-dir $work/logs --mode pool"
sections=" ${SECTIONS:-pair torch safety stress scaling traces sites vmm} "
want() { [[ $sections == *" $1 "* ]]; }

if want pair; then
echo "== pair latency (us, median of 7 batches)"
$work/bench_pair > $work/pair_plain.csv
$pool --no-trace -- $work/bench_pair > $work/pair_pool.csv
$pool -- $work/bench_pair > $work/pair_pool_trace.csv
$bin/cupool run -q --log-dir $work/logs --no-trace -- $work/bench_pair > $work/pair_passthrough.csv
paste -d, $work/pair_plain.csv $work/pair_pool.csv $work/pair_pool_trace.csv $work/pair_passthrough.csv | \
  awk -F, 'NR==1{print "size_bytes  plain_us  pool_us  pool_traced_us  passthrough_us  plain/pool"; next} {printf "%10s  %8s  %7s  %14s  %14s  %9.0fx\n", $1, $2, $4, $6, $8, $2/$4}'

fi
T=$src/torch_transformer.py
if want torch; then
echo "== PyTorch transformer (shared/bench workload)"
MODE=caching python3 $T
MODE=expandable PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 $T
MODE=nocache-raw PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 $T
MODE=nocache-cupool-pool PYTORCH_NO_CUDA_MEMORY_CACHING=1 $pool --no-trace -- python3 $T
python3 -c "import json,glob,os; l=max((json.load(open(p)) for p in glob.glob('$work/logs/run-*/cupool.*.json')), key=lambda l: l['process']['start_unix_ms']); print('pool stats:', json.dumps(l['end']['pools']))" 
MODE=nocache-cupool-pool-traced PYTORCH_NO_CUDA_MEMORY_CACHING=1 $pool -- python3 $T
MODE=caching-cupool-pool $pool --no-trace -- python3 $T
python3 -c "import json,glob,os; l=max((json.load(open(p)) for p in glob.glob('$work/logs/run-*/cupool.*.json')), key=lambda l: l['process']['start_unix_ms']); print('pool stats:', json.dumps(l['end']['pools']))" 
fi

if want safety; then
echo "== stream safety"
$work/stream_safety | sed 's/^/plain: /'
$pool -- $work/stream_safety | sed 's/^/cupool pool: /'
echo "== the first created stream behind the legacy stream's work"
$work/first_stream | sed 's/^/plain: /'
$pool -- $work/first_stream | sed 's/^/cupool pool: /'
fi
if want stress; then
echo "== multi-thread multi-stream stress (10^6 allocations+frees)"
/usr/bin/time -f "plain: %e s" $work/stress 1000000
/usr/bin/time -f "cupool pool: %e s" $pool --no-trace -- $work/stress 1000000
fi

if want scaling; then
echo "== scaling: pairs/s (cudaMalloc 4 KiB + kernel on the thread's stream + cudaFree), best of 3"
best() { for r in 1 2 3; do "$@" | sed -n 's/.*pairs_per_s=\([0-9]*\).*/\1/p'; done | sort -n | tail -1; }
echo "threads  plain  pool(sites off)  pool(default)"
for t in 1 2 4 8; do
  echo "$t  $(best $work/scaling $t 20000)  $(best $pool --no-trace -o stack_depth=0 -o python_depth=0 -- $work/scaling $t 20000)  $(best $pool -- $work/scaling $t 20000)"
done
echo "-- the same without the kernel (allocation alone; plain CUDA left out: its pair is ~80 us)"
echo "threads  pool(sites off)  pool(default)"
for t in 1 2 4 8; do
  echo "$t  $(best $pool --no-trace -o stack_depth=0 -o python_depth=0 -- $work/scaling $t 200000 0)  $(best $pool -- $work/scaling $t 200000 0)"
done
fi
if want traces; then
echo "== traces"
mkdir -p $work/traces
rec() { local name=$1; shift; rm -rf $work/t; PYTORCH_NO_CUDA_MEMORY_CACHING=1 $bin/cupool run -q --log-dir $work/t -- "$@" >/dev/null && gzip -9 -c $work/t/latest/cupool.*.json > $out/$name.json.gz; ls -la $out/$name.json.gz; }
rec torch-transformer python3 -c "import runpy,sys; sys.argv=['x']; exec(open('$T').read().replace('N = 60','N = 10'))"
rec resnet18 python3 $src/trace_cnn.py
rec gpt2 python3 $src/trace_gpt2.py
rm -rf $work/t; cp $src/cupy_count.py $work/; $bin/cupool run -q --log-dir $work/t -- python3 $work/cupy_count.py >/dev/null && gzip -9 -c $work/t/latest/cupool.*.json > $out/cupy.json.gz
$bin/cupool replay $out/*.json.gz
fi

if want sites; then
echo "== allocation sites: cost (transformer, PyTorch's cache off, cupool pool; 3 alternating rounds)"
for round in 1 2 3; do
  MODE=caching python3 $T
  MODE=nocache-pool-nostacks PYTORCH_NO_CUDA_MEMORY_CACHING=1 $pool -o stack_depth=0 -o python_depth=0 -- python3 $T
  MODE=nocache-pool-stacks PYTORCH_NO_CUDA_MEMORY_CACHING=1 $pool -- python3 $T
  MODE=nocache-pool-stacks-notrace PYTORCH_NO_CUDA_MEMORY_CACHING=1 $pool --no-trace -- python3 $T
done
python3 -c "import json,glob; l=max((l for l in (json.load(open(p)) for p in glob.glob('$work/logs/run-*/cupool.*.json')) if any('def' in e for e in l['events'])), key=lambda l: l['process']['start_unix_ms']); d=[e for e in l['events'] if 'def' in e]; print('definitions in the last traced log:', {k: sum(1 for e in d if e['def']==k) for k in ('module','string','stack')}, 'allocs:', sum(1 for e in l['events'] if e.get('ev')=='alloc'))"
fi

if want vmm; then
echo "== VMM pool against PyTorch's two modes (scripts/gpu-vmm.sh: torch, frag)"
OTHER_BUILDS=none SECTIONS="torch frag" ROUNDS=${ROUNDS:-3} NO_SEGMENTS=1 bash scripts/gpu-vmm.sh
fi

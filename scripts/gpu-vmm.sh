#!/usr/bin/env bash
# The VMM-backed pool (backing=vmm, issue 12) on a real GPU, side by side in one run:
#  1. pair latency: cudaMalloc+cudaFree per size, plain / cupool segments / cupool vmm
#     (PAIR_OPTIONS adds flags to both cupool runs, e.g. "-o stack_depth=0 -o python_depth=0")
#  2. the transformer workload (ROUNDS alternating rounds, 3): PyTorch's caching allocator,
#     expandable_segments, and PyTorch without its cache under cupool with segments
#     (unless NO_SEGMENTS is set) and with vmm, and with vmm under `--limit $VMM_LIMIT`
#     when set, and with vmm under each option of VMM_VARIANTS (e.g. "fence_us=2000"),
#     and with the shim of each earlier build named in OTHER_BUILDS (default "old":
#     .gpu/old/libcupool.so) where it exists:
#     ms/iter and peak driver-used memory (nvidia-smi sampled every
#     20 ms, less the idle reading before the run), and the vmm pool's page counts
#  3. a workload that fragments fixed segments into an OOM under a 10 GiB cap
#     (scripts/gpu/frag_oom.py): PyTorch's caching allocator, expandable_segments,
#     cupool segments and cupool vmm (the last two with PyTorch's cache off, --limit 10g)
#  4. stream safety and the multi-stream stress (10^6 ops) under vmm
#  5. IPC of blocks on VMM pages (section ipc): the C program with two blocks of
#     one page range (runtime and driver API, interior pointer; scripts/gpu/ipc_check.py),
#     PyTorch tensor sharing (torch.multiprocessing, cache on), CuPy's IPC API with
#     a receiver under cupool and one outside it
#  6. new allocation traces for `cupool replay` (section traces, written to $OUT):
#     Hugging Face fine-tuning on varied sequence lengths, an inference-server loop
#     (varied batch sizes, prompts and generated lengths), JAX with its platform
#     allocator; a GPT-2-style fine-tuning loop, ResNet-18 at a small batch, a
#     serving mix with embedding requests, a CuPy script and a numba loop with
#     their pools off, a JAX training loop; PyTorch without its cache, recorded
#     under cupool, then replayed (bundle one with scripts/trim-trace.py)
# The same-output check of every program runs as
#   CUPOOL_OPTIONS=backing=vmm bash scripts/gpu-check.sh
# Run from the repository root with the built shim and CLI in .gpu/.
set -u
export PATH=/usr/local/cuda/bin:$PATH
bin=$(pwd)/.gpu
src=$(pwd)/scripts/gpu
work=$(mktemp -d /tmp/cupool-vmm.XXXX)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
nvcc -O2 -arch=native -cudart shared -o $work/bench_pair $src/bench_pair.cu
nvcc -O2 -arch=native -cudart shared -o $work/stream_safety $src/stream_safety.cu
nvcc -O2 -arch=native -cudart shared -o $work/stress $src/stress.cu
seg="$bin/cupool run -q --log-dir $work/logs -o backing=segments"
vmm="$bin/cupool run -q --log-dir $work/logs -o backing=vmm"
sections=" ${SECTIONS:-pair torch frag safety ipc} "
want() { [[ $sections == *" $1 "* ]]; }
last_pools() {
  python3 -c "import json,glob; l=max((json.load(open(p)) for p in glob.glob('$work/logs/**/cupool.*.json', recursive=True)), key=lambda l: l['process']['start_unix_ms'], default=None); print('    (no log in $work/logs)') if l is None else [print('   ', p['backing'], 'reserved peak', p['reserved_bytes']['peak'] >> 20, 'MiB; multi_stream', p.get('multi_stream'), 'fences', p.get('fences'), 'pages', {k: v for k, v in (p.get('pages') or {}).items() if k not in ('idle_bytes', 'pending_bytes')}) for p in l['end']['pools']]"
  rm -rf $work/logs  # each run's line reads its own log, or says there is none
}
# peak_used CMD...: runs CMD, prints its output, then the peak of nvidia-smi's memory.used less the reading before.
peak_used() {
  local base
  base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 20 > $work/smi.txt &
  local smi=$!
  "$@"
  kill $smi; wait $smi 2>/dev/null
  echo "    peak_used_MiB=$(( $(sort -n $work/smi.txt | tail -1) - base ))"
}

if want pair; then
  echo "== pair latency (us, median of 7 batches): plain, cupool segments, cupool vmm (no trace)"
  $work/bench_pair > $work/plain.csv
  $seg --no-trace ${PAIR_OPTIONS:-} -- $work/bench_pair > $work/seg.csv
  $vmm --no-trace ${PAIR_OPTIONS:-} -- $work/bench_pair > $work/vmm.csv
  last_pools
  paste -d, $work/plain.csv $work/seg.csv $work/vmm.csv | awk -F, 'NR==1{print "size_bytes  plain_us  segments_us  vmm_us"; next} {printf "%10s  %8s  %11s  %6s\n", $1, $2, $4, $6}'
fi

T=$src/torch_transformer.py
if want torch; then
  echo "== transformer: ${ROUNDS:-3} alternating rounds"
  for round in $(seq ${ROUNDS:-3}); do
    MODE=caching peak_used python3 $T
    MODE=expandable PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True peak_used python3 $T
    [ -z "${NO_SEGMENTS:-}" ] && MODE=nocache-cupool-segments PYTORCH_NO_CUDA_MEMORY_CACHING=1 peak_used $seg --no-trace -- python3 $T
    MODE=nocache-cupool-vmm PYTORCH_NO_CUDA_MEMORY_CACHING=1 peak_used $vmm --no-trace -- python3 $T
    last_pools
    for b in ${OTHER_BUILDS:-old}; do # earlier builds beside it, preloaded as `cupool run` would
      [ -f $bin/$b/libcupool.so ] || continue
      MODE=nocache-cupool-vmm-$b PYTORCH_NO_CUDA_MEMORY_CACHING=1 CUPOOL_OPTIONS=backing=vmm:trace=0:log_dir=$work/logs \
        LD_PRELOAD=$bin/$b/libcupool.so peak_used python3 $T
      last_pools
    done
    for v in ${VMM_VARIANTS:-}; do
      MODE=nocache-cupool-vmm-$v PYTORCH_NO_CUDA_MEMORY_CACHING=1 peak_used $vmm -o $v --no-trace -- python3 $T
      last_pools
    done
    if [ -n "${VMM_LIMIT:-}" ]; then
      MODE=nocache-cupool-vmm-limit-$VMM_LIMIT PYTORCH_NO_CUDA_MEMORY_CACHING=1 peak_used $vmm --limit $VMM_LIMIT --no-trace -- python3 $T
      last_pools
    fi
  done
fi

if want frag; then
  echo "== fragmentation into OOM under a 10 GiB cap (scripts/gpu/frag_oom.py)"
  F=$src/frag_oom.py
  echo "-- caching"; peak_used python3 $F
  echo "-- expandable"; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True peak_used python3 $F
  echo "-- cupool segments"; NO_TORCH_CAP=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 peak_used $seg --limit 10g -- python3 $F
  echo "-- cupool vmm"; NO_TORCH_CAP=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 peak_used $vmm --limit 10g -- python3 $F
  last_pools
  echo "-- plain, no cap (the checksum every completed run must print)"; NO_TORCH_CAP=1 python3 $F
fi

if want safety; then
  echo "== stream safety"
  $work/stream_safety | sed 's/^/plain: /'
  $vmm -- $work/stream_safety | sed 's/^/cupool vmm: /'
  echo "== multi-thread multi-stream stress (10^6 allocations+frees)"
  /usr/bin/time -f "plain: %e s" $work/stress 1000000
  /usr/bin/time -f "cupool segments: %e s" $seg --no-trace -- $work/stress 1000000
  /usr/bin/time -f "cupool vmm: %e s" $vmm --no-trace -- $work/stress 1000000
  last_pools
fi

if want ipc; then
  echo "== IPC of blocks on VMM pages"
  nvcc -O2 -arch=native -cudart shared -o $work/ipc $(pwd)/tests/fake/ipc_blocks.c -lcuda
  timeout 180 python3 $src/ipc_check.py $work/ipc $bin/cupool $work/ipc-logs vmm | grep '^result:'
  # PyTorch shares CUDA tensors only with its caching allocator on.
  echo "torch-ipc vmm: $(timeout 120 $vmm -- python3 $src/torch_ipc.py 2>&1 | grep '^result:')"
  echo "torch-ipc plain: $(timeout 120 python3 $src/torch_ipc.py 2>&1 | grep '^result:')"
  for receiver in same plain; do
    echo "cupy-ipc vmm $receiver: $(RECEIVER=$receiver timeout 120 $vmm -- python3 $src/cupy_ipc.py 2>&1 | grep '^result:')"
    echo "cupy-ipc segments $receiver: $(RECEIVER=$receiver timeout 120 $seg -- python3 $src/cupy_ipc.py 2>&1 | grep '^result:')"
    echo "cupy-ipc plain $receiver: $(RECEIVER=$receiver timeout 120 python3 $src/cupy_ipc.py 2>&1 | grep '^result:')"
  done
  last_pools
fi

if want traces; then
  echo "== new traces"
  out=${OUT:-$work}
  rec() { local name=$1; shift; rm -rf $work/t; $bin/cupool run -q --mode passthrough --log-dir $work/t -- "$@" | tail -1 && gzip -9 -c $work/t/latest/cupool.*.json > $out/$name.json.gz; ls -la $out/$name.json.gz; }
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 rec hf-finetune python3 $src/trace_hf_finetune.py
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 rec serving python3 $src/trace_serving.py
  XLA_PYTHON_CLIENT_ALLOCATOR=platform XLA_PYTHON_CLIENT_PREALLOCATE=false rec jax-platform python3 $src/trace_jax.py
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 rec gpt-finetune python3 $src/trace_gpt_finetune.py
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 rec resnet-small python3 $src/trace_resnet.py
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 rec serving-mix python3 $src/trace_serving_mix.py
  rec cupy-script python3 $src/trace_cupy.py
  rec numba-loop python3 $src/trace_numba.py
  XLA_PYTHON_CLIENT_ALLOCATOR=platform XLA_PYTHON_CLIENT_PREALLOCATE=false rec jax-train python3 $src/trace_jax_train.py
  $bin/cupool replay $out/*.json.gz
fi

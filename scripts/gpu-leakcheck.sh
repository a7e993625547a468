#!/usr/bin/env bash
# `cupool check` on a real GPU: clean programs give exit 0 and no finding;
# planted leaks are caught at the right site (growth without marks, cache on
# and off; under torchrun with the rank; one leaking pytest test; an nvcc
# program whose exit leaks must equal compute-sanitizer's; the trace off,
# exec, os._exit and subprocess children); and the overhead
# of `cupool check` on the transformer workload beside compute-sanitizer's,
# and on CuPy allocations with CuPy's record on and off.
# SECTIONS picks among "core unseen overhead" (all three by default;
# SKIP_OVERHEAD=1 leaves out the last; ONLY=REGEX runs the rows whose name
# matches): "unseen" runs generation, training
# and array programs of shapes the rules were not built around, loops
# of other libraries and other model families, clean and with a planted
# leak.
# Same setup as scripts/gpu-check.sh (.gpu/ holds the shim and the CLI;
# .gpu/pywheels pytest and pytest-xdist for a machine without them).
set -u
export PATH=/usr/local/cuda/bin:$PATH
root=$(pwd); bin=$root/.gpu; src=$root/scripts/gpu; work=$(mktemp -d /tmp/cupool-leakcheck.XXXX)
rows=()
python3 -m pytest --version >/dev/null 2>&1 || {
  python3 -m pip install -q --no-index --target $work/py $bin/pywheels/*.whl && export PYTHONPATH=$work/py${PYTHONPATH:+:$PYTHONPATH}
}
sections=${SECTIONS:-core unseen overhead}
[ -n "${SKIP_OVERHEAD:-}" ] && sections=${sections/overhead/}
has() { [[ " $sections " == *" $1 "* ]]; }
# Whether ONLY keeps any of the rows named.
wanted() { local n; for n in "$@"; do [[ $n =~ ${ONLY:-.} ]] && return 0; done; return 1; }
if has core && wanted leaks-shared leaks-static cublas-clean cublas-clean-untraced; then
  nvcc -g -O2 -arch=native -cudart shared -o $work/leaks_shared $src/leaks.cu -lcuda
  nvcc -g -O2 -arch=native -o $work/leaks_static $src/leaks.cu -lcuda
  nvcc -O2 -arch=native -cudart shared -o $work/cublas_clean $src/cublas_clean.cu -lcublas
fi

# check NAME EXPECT -- CMD...   (EXPECT as scripts/gpu/check_verdict.py takes it;
# CHECK_FLAGS: more options of cupool check, such as --baseline FILE)
check() {
  local name=$1 expect=$2; shift 3
  [[ $name =~ ${ONLY:-.} ]] || return 0
  timeout 300 $bin/cupool check ${CHECK_FLAGS:-} --log-dir $work/$name --json $work/$name.json -- "$@" > $work/$name.out 2> $work/$name.err
  local rc=$?
  rows+=("$(python3 $src/check_verdict.py $name $rc $work/$name.json $expect)")
  echo "${rows[-1]}"  # as it comes: a run cut short keeps what it checked
  [[ ${rows[-1]} == *"| FAIL |"* ]] && tail -n 5 $work/$name.err | sed 's/^/    /'
}
# line FILE [MARK]: the line of FILE that ends with "# MARK" (ALLOCATED).
line() { grep -n "# ${2:-ALLOCATED}$" $src/$1 | cut -d: -f1; }
if has core; then
check torch-clean-cache clean -- python3 $src/train_loop.py
PYTORCH_NO_CUDA_MEMORY_CACHING=1 check torch-clean-nocache clean -- python3 $src/train_loop.py
check cupy-clean clean -- python3 $src/cupy_clean.py
check jax-clean clean -- python3 $src/jax_step.py
check cublas-clean clean -- $work/cublas_clean
# Programs the rules were not built around: arenas that grow while they warm
# up, a generation's cache replaced by larger tensors every token, short loops.
XLA_PYTHON_CLIENT_PREALLOCATE=false check jax-loop-clean clean -- python3 $src/jax_loop.py
XLA_PYTHON_CLIENT_PREALLOCATE=false LEAK=1 MARK=1 check jax-loop-leak growth:jax_loop.py:$(line jax_loop.py) -- python3 $src/jax_loop.py
LEAK=1 MARK=1 check jax-prealloc-leak growth:jax_loop.py:$(line jax_loop.py) -- python3 $src/jax_loop.py
XLA_PYTHON_CLIENT_PREALLOCATE=false LEAK=1 check jax-fast-unmarked "note:in one sample" -- python3 $src/jax_loop.py
check hf-generate-clean clean -- python3 $src/hf_generate.py
check hf-finetune-clean clean -- python3 $src/hf_finetune.py
LEAK=1 check hf-finetune-leak growth:hf_finetune.py:$(line hf_finetune.py) -- python3 $src/hf_finetune.py
check cupy-loop-clean clean -- python3 $src/cupy_loop.py
LEAK=1 check cupy-loop-leak growth:cupy_loop.py:$(line cupy_loop.py) -- python3 $src/cupy_loop.py
check numba-clean clean -- python3 $src/numba_loop.py
LEAK=1 check numba-leak growth:numba_loop.py:$(line numba_loop.py) -- python3 $src/numba_loop.py
check torch-graphs-clean clean -- python3 $src/torch_graph.py
check pytest-budget budget:test_past_its_limit -- python3 -m pytest -q -p no:cacheprovider $src/pytest_budget
# The job's budget, and a run's --json as the next run's baseline: the same
# peak passes it, four times that fails it.
PEAK_MIB=64 check peak-baseline clean -- python3 $src/peak.py
PEAK_MIB=64 CHECK_FLAGS="--baseline $work/peak-baseline.json" check peak-as-baseline clean -- python3 $src/peak.py
PEAK_MIB=256 CHECK_FLAGS="--baseline $work/peak-baseline.json" check peak-past-baseline budget:peak.py -- python3 $src/peak.py
PEAK_MIB=256 CHECK_FLAGS="-o max_peak_bytes=128m" check peak-past-job-budget budget:peak.py -- python3 $src/peak.py
# The trace off: a clean process still writes its end record, so it is
# checked. Ways out past atexit: exec (what is queued is written first; with
# the trace off the end record), os._exit, and subprocess's vfork children
# that exec or, when that fails, _exit, inside the parent's session.
CHECK_FLAGS="-o trace=0" check cupy-clean-untraced clean -- python3 $src/cupy_clean.py
CHECK_FLAGS="-o trace=0" check cublas-clean-untraced clean -- $work/cublas_clean
check subprocess-clean clean -- python3 $src/exit_paths.py
EXIT_BY=exec check exec-clean clean -- python3 $src/exit_paths.py
LEAK=1 EXIT_BY=exec check exec-leak exit:exit_paths.py:$(line exit_paths.py) -- python3 $src/exit_paths.py
LEAK=1 EXIT_BY=exec CHECK_FLAGS="-o trace=0" check exec-leak-untraced exit:exit_paths.py:$(line exit_paths.py) -- python3 $src/exit_paths.py
LEAK=1 EXIT_BY=_exit CHECK_FLAGS="-o trace=0" check os-exit-leak-untraced exit:exit_paths.py:$(line exit_paths.py) -- python3 $src/exit_paths.py
# A check where the shim never loaded is not a pass.
check not-loaded status:66 -- env -u LD_PRELOAD python3 $src/cupy_clean.py
check ddp-clean clean -- torchrun --standalone --nproc_per_node 2 $src/ddp_loop.py
LEAK=1 check torch-leak-cache growth:train_loop.py:$(grep -n '# ALLOCATED' $src/train_loop.py | cut -d: -f1) -- python3 $src/train_loop.py
LEAK=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 check torch-leak-nocache growth:train_loop.py:$(grep -n '# ALLOCATED' $src/train_loop.py | cut -d: -f1) -- python3 $src/train_loop.py
LEAK=1 check ddp-leak growth:ddp_loop.py:$(grep -n '# ALLOCATED' $src/ddp_loop.py | cut -d: -f1):0,1 -- torchrun --standalone --nproc_per_node 2 $src/ddp_loop.py
check pytest-one-leak test:test_leaks_a_buffer:test_cuda_suite.py:$(grep -n "_kept.append" $src/pytest_suite/test_cuda_suite.py | cut -d: -f1) -- python3 -m pytest -q -p no:cacheprovider $src/pytest_suite
check pytest-xdist-one-leak test:test_leaks_a_buffer -- python3 -m pytest -q -p no:cacheprovider -n 2 $src/pytest_suite
for v in shared static; do
  wanted leaks-$v || continue
  compute-sanitizer --leak-check full $work/leaks_$v > $work/sanitizer-$v.txt 2>&1
  check leaks-$v sanitizer:$work/sanitizer-$v.txt -- $work/leaks_$v
done
# What a user sees for one of them.
[ -f $work/torch-leak-nocache.err ] && sed -n 1,40p $work/torch-leak-nocache.err
fi

if has unseen; then
for s in llama beam sample t5 repeat static assisted bert; do SHAPE=$s check hf-$s-clean clean -- python3 $src/hf_shapes.py; done
check hf-trainer-clean clean -- python3 $src/hf_trainer.py
LEAK=1 check hf-trainer-leak growth:hf_trainer.py:$(line hf_trainer.py) -- python3 $src/hf_trainer.py
SHAPE=repeat LEAK=1 check hf-repeat-leak growth:hf_shapes.py:$(line hf_shapes.py) -- python3 $src/hf_shapes.py
SHAPE=bert LEAK=1 check hf-bert-leak growth:hf_shapes.py:$(line hf_shapes.py) -- python3 $src/hf_shapes.py
for s in compile graphs amp eval empty loader accum streams sizes ema; do SHAPE=$s check torch-$s-clean clean -- python3 $src/torch_shapes.py; done
SHAPE=eval LEAK=1 check torch-eval-leak growth:torch_shapes.py:$(line torch_shapes.py) -- python3 $src/torch_shapes.py
SHAPE=compile LEAK=1 check torch-compile-leak growth:torch_shapes.py:$(line torch_shapes.py) -- python3 $src/torch_shapes.py
SHAPE=accum LEAK=1 check torch-accum-leak growth:torch_shapes.py:$(line torch_shapes.py) -- python3 $src/torch_shapes.py
SHAPE=ema LEAK=1 LEAK_EVERY=5 check torch-ema-sparse-leak growth:torch_shapes.py:$(line torch_shapes.py) -- python3 $src/torch_shapes.py
PYTORCH_NO_CUDA_MEMORY_CACHING=1 SHAPE=sizes check torch-sizes-nocache-clean clean -- python3 $src/torch_shapes.py
PYTORCH_NO_CUDA_MEMORY_CACHING=1 SHAPE=sizes LEAK=1 check torch-sizes-nocache-leak growth:torch_shapes.py:$(line torch_shapes.py) -- python3 $src/torch_shapes.py
for s in scan shapes donate adam host remat cond; do
  XLA_PYTHON_CLIENT_PREALLOCATE=false SHAPE=$s check jax-$s-clean clean -- python3 $src/jax_shapes.py
done
XLA_PYTHON_CLIENT_PREALLOCATE=false SHAPE=shapes LEAK=1 check jax-shapes-leak growth:jax_shapes.py:$(line jax_shapes.py) -- python3 $src/jax_shapes.py
XLA_PYTHON_CLIENT_PREALLOCATE=false SHAPE=host LEAK=1 check jax-host-leak growth:jax_shapes.py:$(line jax_shapes.py) -- python3 $src/jax_shapes.py
XLA_PYTHON_CLIENT_PREALLOCATE=false SHAPE=cond LEAK=1 check jax-cond-leak growth:jax_shapes.py:$(line jax_shapes.py) -- python3 $src/jax_shapes.py
for s in fft kernel mixed linalg streams; do SHAPE=$s check cupy-$s-clean clean -- python3 $src/cupy_shapes.py; done
SHAPE=mixed LEAK=1 check cupy-mixed-leak growth:cupy_shapes.py:$(line cupy_shapes.py) -- python3 $src/cupy_shapes.py
THREAD=1 SHAPE=mixed check cupy-thread-clean clean -- python3 $src/cupy_shapes.py
THREAD=1 SHAPE=mixed LEAK=1 check cupy-thread-leak growth:cupy_shapes.py:$(line cupy_shapes.py) -- python3 $src/cupy_shapes.py
SHAPE=streams LEAK=1 check cupy-streams-leak growth:cupy_shapes.py:$(line cupy_shapes.py) -- python3 $src/cupy_shapes.py
for s in defer streams many; do SHAPE=$s check numba-$s-clean clean -- python3 $src/numba_shapes.py; done
for s in defer many; do SHAPE=$s LEAK=1 check numba-$s-leak growth:numba_shapes.py:$(line numba_shapes.py) -- python3 $src/numba_shapes.py; done
# Libraries' loops: Lightning, PyTorch Geometric, GPyTorch, Triton, a graph
# captured by hand, NumPyro's NUTS on JAX, BoTorch, TorchMetrics.
for s in lightning geometric gpytorch triton graph botorch metrics; do
  SHAPE=$s check lib-$s-clean clean -- python3 $src/lib_shapes.py
done
XLA_PYTHON_CLIENT_PREALLOCATE=false SHAPE=numpyro check lib-numpyro-clean clean -- python3 $src/lib_shapes.py
for s in lightning geometric gpytorch triton graph metrics; do
  SHAPE=$s LEAK=1 check lib-$s-leak growth:lib_shapes.py:$(line lib_shapes.py) -- python3 $src/lib_shapes.py
done
# More libraries' loops: Flax NNX with Optax, Equinox (JAX's arena
# preallocated), timm, PEFT's LoRA, Accelerate; JAX's leaks marked.
for s in timm peft accelerate; do SHAPE=$s check lib-$s-clean clean -- python3 $src/lib_shapes.py; done
XLA_PYTHON_CLIENT_PREALLOCATE=false SHAPE=flax check lib-flax-clean clean -- python3 $src/lib_shapes.py
XLA_PYTHON_CLIENT_PREALLOCATE=false SHAPE=flax MARK=1 check lib-flax-marked-clean clean -- python3 $src/lib_shapes.py
SHAPE=equinox check lib-equinox-clean clean -- python3 $src/lib_shapes.py
for s in timm peft accelerate; do
  SHAPE=$s LEAK=1 check lib-$s-leak growth:lib_shapes.py:$(line lib_shapes.py) -- python3 $src/lib_shapes.py
done
XLA_PYTHON_CLIENT_PREALLOCATE=false SHAPE=flax LEAK=1 MARK=1 check lib-flax-leak growth:lib_shapes.py:$(line lib_shapes.py) -- python3 $src/lib_shapes.py
SHAPE=equinox LEAK=1 MARK=1 check lib-equinox-leak growth:lib_shapes.py:$(line lib_shapes.py) -- python3 $src/lib_shapes.py
SHAPE=deferred check numba-deferred-leak growth:numba_shapes.py:$(line numba_shapes.py DEFERRED) -- python3 $src/numba_shapes.py
# Model families and loop shapes: a GAN, Faster R-CNN, a mixture of
# experts, PPO, a diffusion model, CuPy and PyTorch through DLPack, a JAX
# recurrent net under lax.scan, spectrograms of clips of many lengths; the
# JAX leak marked.
for s in gan detection moe ppo diffusion interop stft; do
  SHAPE=$s check model-$s-clean clean -- python3 $src/model_shapes.py
done
XLA_PYTHON_CLIENT_PREALLOCATE=false SHAPE=scan check model-scan-clean clean -- python3 $src/model_shapes.py
for s in gan detection moe ppo diffusion interop stft; do
  SHAPE=$s LEAK=1 check model-$s-leak growth:model_shapes.py:$(line model_shapes.py) -- python3 $src/model_shapes.py
done
XLA_PYTHON_CLIENT_PREALLOCATE=false SHAPE=scan LEAK=1 MARK=1 check model-scan-leak growth:model_shapes.py:$(line model_shapes.py) -- python3 $src/model_shapes.py
fi

if has overhead; then
echo "== overhead: transformer workload (10 timed iterations), plain / cupool check / compute-sanitizer"
T=$work/t.py; sed 's/N = 60/N = 10/' $src/torch_transformer.py > $T
for round in 1 2; do
  MODE=plain python3 $T
  MODE=cupool-check $bin/cupool check --log-dir $work/over-$round -- python3 $T 2>/dev/null
  MODE=plain-nocache PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 $T
  MODE=cupool-check-nocache-pool PYTORCH_NO_CUDA_MEMORY_CACHING=1 $bin/cupool check --mode pool --log-dir $work/overp-$round -- python3 $T 2>/dev/null
done
MODE=compute-sanitizer compute-sanitizer --leak-check full python3 $T 2>&1 | grep mode=
echo "== overhead: CuPy arrays made and dropped, plain / cupool check (CuPy's record on, off), 3 rounds"
for round in 1 2 3; do
  MODE=plain python3 $src/cupy_alloc_cost.py
  MODE=check-record $bin/cupool check --log-dir $work/cc-$round -- python3 $src/cupy_alloc_cost.py 2>/dev/null
  MODE=check-no-record $bin/cupool check -o cupy_history=0 --log-dir $work/cn-$round -- python3 $src/cupy_alloc_cost.py 2>/dev/null
done
fi
# The verdicts and reports; the logs stay behind (each run's are large).
tar czf ${OUT:-$work}/gpu-leakcheck.tgz -C $work --exclude='cupool.*.json' --exclude='cupool-torch.*' \
  --exclude='cupool-jax.*' --exclude='cupool-cupy.*' --exclude='py' . 2>/dev/null
echo
printf '%s\n' "${rows[@]}"

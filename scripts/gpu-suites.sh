#!/usr/bin/env bash
# Real projects' own CUDA test suites, run twice on a GPU: plainly and under
# `cupool run --mode pool`. junit_compare.py compares the outcome of every test
# (passed, failed, skipped) by pytest node id; the table printed last has, per
# suite, the number of tests, passed/failed/skipped plain and under the pool,
# SAME or the tests that differ, and both wall times. A test that differs is
# run again on its own plainly, under the pool and under
# `cupool run --mode passthrough`, so a flaky test shows as one.
#
# The suites' sources are not in this repository: put them under .gpu/suites/
# (git-ignored) from the projects' repositories at the tags of the installed
# versions (BENCHMARKS.md, "Real projects' test suites under the pool", says
# which files and commits):
#   .gpu/suites/cupy/{pyproject.toml,tests/...}     CuPy's tests/ and pytest settings
#       (from a fetched mirror: mkdir -p .gpu/suites/cupy && git --git-dir MIRROR
#        archive v14.2.0 pyproject.toml tests | tar -x -C .gpu/suites/cupy; 4.5 MB)
#   .gpu/suites/torch/test/test_{cuda,multiprocessing}.py (and a conftest.py
#       standing in for names the installed torch.testing lacks), and
#       test_cuda_graphs.py: test_cuda.py's header with its graph and memory
#       pool test classes (BENCHMARKS.md, section 8, says which)
#   (numba-cuda's tests come with the installed package: nothing to put there)
# Same setup as scripts/gpu-check.sh otherwise (.gpu/ holds the shim and the
# CLI; .gpu/pywheels/ the wheels of pytest-timeout and expecttest):
#   bash scripts/gpu-suites.sh                      (prints a table last)
# (Run it from the checkout whose scripts/ and .gpu/ it should use: from
# another worktree, copy both into a folder of that checkout that
# .git/info/exclude ignores and run the script from inside it.)
# SUITES="cupy-cuda torch-mp" picks suites; SUITE_CAP (seconds, default 300)
# stops a run with SIGINT, after which pytest still writes its report (only
# the tests both runs reached are compared then); SUITE_TEST_TIMEOUT (default
# 120) is pytest-timeout's limit per test (keep it under SUITE_CAP for
# test_multiprocessing.py, whose hung tests otherwise hold the run until the
# cap, and under cupool the SIGINT did not end it: no report; a run still
# going 30 s after the SIGINT is killed, rc 137, and counts as cut too); COLLECT_ONLY=1
# only collects.
set -u
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
root=$(pwd); bin=$root/.gpu; suites=$root/.gpu/suites; src=$(cd "$(dirname "$0")" && pwd)/gpu
work=$(mktemp -d /tmp/cupool-suites.XXXX); out=${OUT:-$work}
cap=${SUITE_CAP:-300}
rows=()

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
source $src/suite_common.sh
install_carried_wheels $bin/pywheels $work/py
[ -d $work/py ] && export PYTHONPATH=$work/py${PYTHONPATH:+:$PYTHONPATH}
python3 - <<'EOF'
import importlib, importlib.metadata as md, platform
print("python", platform.python_version())
for dist in ("torch", "cupy-cuda13x", "cupy-cuda12x", "cupy", "numpy", "scipy", "pytest", "pytest-xdist", "pytest-timeout", "psutil", "expecttest", "hypothesis", "numba", "numba-cuda", "cuda-python", "filecheck"):
    try:
        print(f"{dist} {md.version(dist)}")
    except md.PackageNotFoundError:
        pass
try:
    import torch
    print("torch.version.cuda", torch.version.cuda, torch.cuda.get_device_name(0))
except Exception as e:
    print("torch:", e)
EOF
timeout_flag=() xdist=()
python3 -c "import pytest_timeout" 2>/dev/null && timeout_flag=(--timeout=${SUITE_TEST_TIMEOUT:-120})
# CuPy's suites run under pytest-xdist where it is there (as CuPy's CI runs
# them; each worker is a process of its own, under cupool too); PyTorch's
# serially (test_cuda.py reads the device's memory statistics).
python3 -c "import xdist" 2>/dev/null && [ ${SUITE_WORKERS:-4} -gt 1 ] && xdist=(-n ${SUITE_WORKERS:-4})

# one_run NAME MODE DIR ARGS...: MODE is plain, pool or passthrough; prints the
# run's wall seconds; the report is $work/NAME.MODE.xml. (timeout runs inside
# cupool: `cupool run` ignores SIGINT, as a shell does.)
one_run() {
  local name=$1 mode=$2 dir=$3; shift 3
  local tag=$name.$mode
  local env=(CUPY_CACHE_DIR=$work/$tag.kernels TORCHINDUCTOR_CACHE_DIR=$work/$tag.inductor TRITON_CACHE_DIR=$work/$tag.triton)
  local cmd=(timeout -s INT -k 30 $cap python3 -m pytest -q -rA -p no:cacheprovider --rootdir=. -o junit_family=xunit1 --junitxml=$work/$tag.xml "${timeout_flag[@]}" "$@")
  [ $mode = plain ] || cmd=($bin/cupool run --mode $mode --log-dir $work/$tag.logs ${CUPOOL_FLAGS:-} -- "${cmd[@]}")
  local t0=$(date +%s.%N)
  (cd $dir && env "${env[@]}" "${cmd[@]}" > $work/$tag.out 2>&1)
  echo $? > $work/$tag.rc
  python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')"
}

# suite NAME DIR ARGS...: both runs, the row, and the re-runs of what differs.
suite() {
  local name=$1 dir=$2; shift 2
  case " ${SUITES:-$name} " in *" $name "*) ;; *) return ;; esac
  if [ "$1" = --pyargs ]; then
    # Tests shipped inside an installed package, named as modules.
    if ! python3 -c "import $2" 2>/dev/null; then
      rows+=("$(printf '%-22s | %s does not import here' $name "$2")"); return
    fi
  elif [ ! -e "$dir/${1%%::*}" ]; then
    rows+=("$(printf '%-22s | no sources at %s' $name "${dir#$root/}/$1")"); return
  fi
  if [ "${COLLECT_ONLY:-0}" = 1 ]; then
    (cd $dir && python3 -m pytest --collect-only -q -p no:cacheprovider "$@" 2>&1 | tail -n 3) | sed "s/^/[$name collect] /"
    return
  fi
  local t_plain t_pool
  t_plain=$(one_run $name plain $dir "$@")
  t_pool=$(one_run $name pool $dir "$@")
  for mode in plain pool; do
    grep -E "^=* ?[0-9]+ (passed|failed|skipped|error)|no tests ran|Interrupted" $work/$name.$mode.out | tail -n 2 | sed "s/^/[$name $mode rc=$(cat $work/$name.$mode.rc)] /"
  done
  grep -A3 -h "^cupool: " $work/$name.pool.out | head -n 8 | sed "s/^/[$name pool] /"
  # A run that could not collect its tests compares nothing: say so, never SAME.
  if grep -qs "errors\? during collection" $work/$name.{plain,pool}.out; then
    grep -h -m3 "^E  " $work/$name.{plain,pool}.out | sort -u | sed "s/^/[$name collect] /"
    rows+=("$(printf '%-22s | NOT COMPARED: tests failed to collect (%s)' $name "$(grep -h -o '[0-9]* errors\? during collection' $work/$name.{plain,pool}.out | head -n 1)")")
    return
  fi
  # The exit statuses too: the same tests with a different status (a crash
  # at exit, after the report was written) is a difference of its own.
  local rc_plain=$(cat $work/$name.plain.rc) rc_pool=$(cat $work/$name.pool.rc)
  local exits="$rc_plain/$rc_pool"; [ "$rc_plain" = "$rc_pool" ] || exits="$exits EXIT DIFFERS"
  rows+=("$(python3 $src/junit_compare.py row $name $work/$name.plain.xml $work/$name.pool.xml $t_plain $t_pool $work/$name.diff $(grep -qxE "124|137" $work/$name.{plain,pool}.rc && echo cut)) | $exits")
  local n=$(wc -l < $work/$name.diff)
  if [ $n -gt 0 ] && [ $n -le 40 ]; then
    mapfile -t ids < $work/$name.diff
    # The suite's ini overrides and plugins hold for its tests run alone too.
    local ini=() prev=
    for a in "$@"; do case $prev in -o|-p) ini+=("$prev" "$a") ;; esac; prev=$a; done
    for mode in plain pool passthrough; do
      one_run $name.again $mode $dir "${ini[@]}" "${ids[@]}" > /dev/null
    done
    python3 $src/junit_compare.py outcomes $work/$name.again.{plain,pool,passthrough}.xml | sed "s/^/[$name again] /"
    # What the pool saw of them: its allocations, frees and CUDA's refusals, in order.
    python3 - $work/$name.again.pool.logs <<'EOF' | head -n 40 | sed "s/^/[$name again pool log] /"
import glob, json, sys
for path in sorted(glob.glob(sys.argv[1] + "/run-*/cupool.*.json")):
    log = json.load(open(path))
    for e in log["events"]:
        if e.get("ev") in ("alloc", "free", "alloc_failed", "oom") and e.get("size", 0) >= 1 << 30:
            # api and kind are left out at their defaults (log version 5)
            api = e.get("api", {"alloc": "cudaMalloc", "free": "cudaFree"}.get(e["ev"], ""))
            print(e["ev"], api, e.get("kind", "device"), f"{e['size'] / 2**30:.2f} GiB", "result=%s" % e.get("result", ""))
EOF
  fi
}

k_torch_cuda="memory or alloc or stream or graph or caching or ipc"
suite cupy-cuda $suites/cupy tests/cupy_tests/cuda_tests "${xdist[@]}"
# the memory, stream and NCCL files of cuda_tests alone (a quicker re-run)
suite cupy-cuda-mem $suites/cupy tests/cupy_tests/cuda_tests/test_memory.py tests/cupy_tests/cuda_tests/test_memory_hook.py \
  tests/cupy_tests/cuda_tests/test_stream.py tests/cupy_tests/cuda_tests/test_nccl.py "${xdist[@]}"
suite cupy-cai $suites/cupy tests/cupy_tests/core_tests/test_ndarray_cuda_array_interface.py "${xdist[@]}"
suite cupy-linalg $suites/cupy tests/cupy_tests/linalg_tests "${xdist[@]}"
suite cupyx-sparse $suites/cupy tests/cupyx_tests/scipy_tests/sparse_tests "${xdist[@]}"
suite torch-cuda $suites/torch/test test_cuda.py -k "$k_torch_cuda"
suite torch-mp-cuda $suites/torch/test test_multiprocessing.py -k cuda
# test_cuda.py's graph, memory-pool and caching-allocator classes (TestCuda's
# test_graph*/test_cuda_graph*, TestCudaMallocAsync, TestBlockStateAbsorption,
# TestCachingHostAllocatorCudaGraph, TestMemPool), copied verbatim
suite torch-cuda-graphs $suites/torch/test test_cuda_graphs.py
# numba-cuda's own tests, by module (suite_common.sh says which and why),
# with the plugin that stands in for its repository's conftest.py.
export PYTHONPATH=$src/plugins${PYTHONPATH:+:$PYTHONPATH}
suite numba-cuda $work "${numba_cuda_pytest_args[@]}"

tar czf $out/gpu-suites.tgz -C $work --exclude='*.logs' --exclude='*.kernels' --exclude='*.inductor' --exclude='*.triton' --exclude=py . 2>/dev/null
echo
echo "suite                  | tests | plain p/f/s   | pool p/f/s    | outcome | wall plain, pool | exit plain/pool"
printf '%s\n' "${rows[@]}"

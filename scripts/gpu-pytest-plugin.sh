#!/usr/bin/env bash
# The pytest plugin (python/cupool/pytest_plugin.py) under the real shim with
# PyTorch and CuPy: a suite with a matmul (cuBLAS workspace), a leaked tensor,
# cached reuse, a reference cycle, a failing test holding memory, a CuPy leak,
# an opted-out leak and a session-scoped model; serially and under
# pytest-xdist; and a torch suite that never touches CUDA, which the plugin
# must not start. Needs the shim at .gpu/libcupool.so (or $CUPOOL_LIB), and
# python3 with torch, cupy, pytest and pytest-xdist.
set -u
root=$(pwd); src=$root/scripts/gpu/pytest_plugin; work=$(mktemp -d /tmp/cupool-pytest.XXXX)
shim=${CUPOOL_LIB:-$root/.gpu/libcupool.so}
export PYTHONPATH=$root/python PYTHONUNBUFFERED=1
cp -r $src/suite $src/nocuda $work/
pytest_under() { LD_PRELOAD=$shim CUPOOL_OPTIONS=log_dir=$1 python3 -m pytest -q -s -p no:cacheprovider "${@:2}"; }
pytest_under $work/serial --rootdir $work/suite -p cupool $work/suite > $work/serial.out 2>&1
python3 $src/expect.py $work/serial serial
PYTEST_PLUGINS=cupool.pytest_plugin pytest_under $work/xdist --rootdir $work/suite -n 2 $work/suite > $work/xdist.out 2>&1
python3 $src/expect.py $work/xdist xdist
pytest_under $work/nocuda --rootdir $work/nocuda -p cupool $work/nocuda > $work/nocuda.out 2>&1
echo "result: nocuda-not-started $(grep -q CUDA_INITIALISED=False $work/nocuda.out && echo PASS || echo FAIL)"
python3 $src/expect.py $work/nocuda nocuda

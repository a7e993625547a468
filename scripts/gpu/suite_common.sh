# Sourced by scripts/gpu-suites.sh and scripts/gpu-exit-crash.sh: what both
# need to run a suite the same way.

# install_carried_wheels DIR TARGET: the wheels carried in DIR (pytest-timeout;
# expecttest, which torch.testing._internal needs) installed into TARGET where
# the machine lacks their module.
install_carried_wheels() {
  local whl mod
  for whl in "$1"/*.whl; do
    [ -e "$whl" ] || continue
    mod=$(basename "$whl" | cut -d- -f1)
    python3 -c "import $mod" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --target "$2" "$whl"
  done
}

# numba-cuda ships its tests in the package (as its own CI runs them, by
# module): the driver-level tests (memory, deallocation queues, external
# memory managers, contexts, device reset, streams) and its CUDA IPC, which
# sends the offset of a pointer from the base that cuMemGetAddressRange gives;
# serially, as its multiprocessing tests spawn processes of their own.
# consider_namespace_packages, as numba-cuda's own pytest.ini sets it: else
# pytest puts numba_cuda/numba (the first folder up without an __init__.py)
# on sys.path, where its cuda/ hides cuda-python's `cuda` package.
# The installed package lacks the conftest.py of numba-cuda's repository,
# which adds an option and a class fixture that its test cases ask for by
# name; a plugin of ours gives both (scripts/gpu/plugins/, on PYTHONPATH).
numba_cuda_pytest_args=(--pyargs numba.cuda.tests.cudadrv
  numba.cuda.tests.cudapy.test_ipc numba.cuda.tests.cudapy.test_multiprocessing
  numba.cuda.tests.cudapy.test_multithreads numba.cuda.tests.cudapy.test_stream_api
  -o consider_namespace_packages=true -p numba_cuda_repo_conftest)

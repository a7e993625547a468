"""What numba-cuda's repository conftest.py gives its tests, as a pytest plugin.

The installed package ships the tests without that file; its test cases ask for
an option and a class fixture by name. Loaded with ``-p numba_cuda_repo_conftest``
(scripts/gpu-suites.sh, scripts/gpu-exit-crash.sh), found on PYTHONPATH.
"""

import pytest


def pytest_addoption(parser):
    parser.addoption("--dump-failed-filechecks", action="store_true", default=False)


@pytest.fixture(scope="class")
def initialize_from_pytest_config(request):
    # FileCheck failures are reported as the option asks (off here).
    request.cls._dump_failed_filechecks = request.config.getoption("dump_failed_filechecks")

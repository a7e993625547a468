"""pytest plugin: the device memory each test leaves behind, under cupool.

Load it with ``pytest -p cupool.pytest_plugin`` (or ``-p cupool``); ``cupool
check`` loads it through ``PYTEST_PLUGINS``, and the wheel's ``pytest11``
entry point loads it into every pytest run. It does nothing unless the
process runs under cupool (``cupool.available()``): then, per test, it
writes one record into ``<log_dir>/cupool-tests.<pid>.json`` (see
docs/log-schema.md) saying how many bytes of device memory the test
allocated and left live.

What counts as the test's
  The window is the whole test: function-scoped fixtures' setup, the call,
  and their teardown. Memory a function-scoped fixture makes and its
  teardown frees nets out; memory it never frees is the test's leak.
  Fixtures of a wider scope (class, module, package, session) are set up
  by the first test that needs them and torn down by the last one: their
  setup and teardown are left out of the count of whichever test they
  happen in, so a session-scoped model is blamed on no test. Each such
  setup and teardown is a nested phase ``fixture:<scope>:<name>`` in the
  log, so that ``cupool check`` leaves its allocations out too.

How it is measured
  Before the test, the counters are read; after it, again. When nothing
  grew that is the answer (cheap: no collection). When something grew,
  the plugin drops the interpreter's reference to a failed test's
  traceback (``sys.last_traceback``, which pytest sets and which keeps the
  test's locals alive), releases PyTorch's cuBLAS workspaces (kept per
  handle and stream after a first matmul; PyTorch's own leak check
  releases them too), waits for the devices it knows to be in use, and
  reads the counters again. Only when something still grew does it run
  ``gc.collect()`` (tenths of a second with a framework loaded, so not
  for every test that ran a matmul), wait again and read them once more.

  The counters: PyTorch's ``memory_stats()`` per device (bytes in live
  tensors, not in its cache) when torch is imported and has initialised
  CUDA; CuPy's default memory pool ``used_bytes()`` (current device) when
  cupy is imported; both, summed per device, when both are; cupool's own
  ``allocated_bytes`` per device otherwise. The plugin never imports a
  framework the tests did not import, and never touches a framework while
  the process has made no CUDA allocation (so it never starts CUDA).

Opt out per test with ``@pytest.mark.cupool_no_leak_check``. Under
pytest-xdist each worker is a process of its own and writes its own file;
the controller runs no test and writes none.
"""

import gc
import json
import os
import sys

import pytest

from cupool._options import flag as _flag
from cupool._options import option, parse_options

MARKER = "cupool_no_leak_check"
LIMIT_MARKER = "cupool_limit_memory"
_PLUGIN_NAME = "cupool-leak-check"
SCHEMA = "cupool-tests"
VERSION = 1
# The shim keeps counters for this many devices (src/observe/counters.rs).
_MAX_DEVICES = 64
_PHASE_PREFIX = "test:"
_FIXTURE_PREFIX = "fixture:"


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        MARKER + ": cupool does not check this test for device memory it leaves allocated",
    )
    config.addinivalue_line(
        "markers",
        LIMIT_MARKER + "(limit): cupool check fails the job when this test's peak of device memory (the most it "
        "allocated above what was live when it began; caches not counted) passes limit, such as '512 MiB'",
    )
    # Reached once per way the plugin was named (-p cupool, -p cupool.pytest_plugin,
    # PYTEST_PLUGINS, the entry point): the checker must exist once.
    if config.pluginmanager.has_plugin(_PLUGIN_NAME):
        return
    import cupool

    if not cupool.available():
        return
    options = parse_options(os.environ.get("CUPOOL_OPTIONS", ""))
    if not _flag(option(options, "log"), True):
        return
    log_dir = os.path.abspath(option(options, "log_dir"))
    workerinput = getattr(config, "workerinput", None)
    worker = workerinput.get("workerid") if isinstance(workerinput, dict) else None
    config.pluginmanager.register(LeakCheck(log_dir, worker, option(options, "run_id")), _PLUGIN_NAME)


# ---------------------------------------------------------------------------
# Counters


class _Snapshot:
    """Counters at one instant: {(source, device): (bytes, count or None)}."""

    __slots__ = ("values", "frameworks")

    def __init__(self):
        self.values = {}
        self.frameworks = []

    def minus(self, other):
        d = {}
        for key in set(self.values) | set(other.values):
            b1, c1 = self.values.get(key, (0, 0))
            b0, c0 = other.values.get(key, (0, 0))
            d[key] = (b1 - b0, None if c1 is None or c0 is None else c1 - c0)
        return d


def _add(into, delta):
    for key, (b, c) in delta.items():
        b0, c0 = into.get(key, (0, 0))
        into[key] = (b0 + b, None if c is None or c0 is None else c0 + c)


def _torch_in_use():
    torch = sys.modules.get("torch")
    try:
        return torch if torch is not None and torch.cuda.is_initialized() else None
    except Exception:
        return None


def _snapshot():
    from cupool import _raw

    snap = _Snapshot()
    touched = False
    for d in range(_MAX_DEVICES):
        try:
            s = _raw(d)
        except ValueError:  # a shim that keeps fewer devices
            break
        if s.num_allocs or s.allocated_bytes:
            touched = True
            snap.values[("cupool", d)] = (int(s.allocated_bytes), int(s.allocations))
    if not touched:
        # No CUDA allocation yet: no framework holds device memory, and
        # asking one might start CUDA.
        return snap
    torch = _torch_in_use()
    if torch is not None:
        try:
            for d in range(torch.cuda.device_count()):
                st = torch.cuda.memory_stats(d)
                if st.get("reserved_bytes.all.current", 0) or st.get("allocated_bytes.all.current", 0):
                    snap.values[("torch", d)] = (
                        int(st.get("allocated_bytes.all.current", 0)),
                        int(st.get("allocation.all.current", 0)),
                    )
            snap.frameworks.append("torch")
        except Exception:
            pass
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            used = int(cupy.get_default_memory_pool().used_bytes())
            snap.values[("cupy", int(cupy.cuda.runtime.getDevice()))] = (used, None)
            snap.frameworks.append("cupy")
        except Exception:
            pass
    return snap


def _settle(snap, collect):
    """Lets go of what finished work and, with ``collect``, garbage still hold."""
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            try:
                delattr(sys, name)
            except AttributeError:
                pass
    if collect:
        gc.collect()
    torch = _torch_in_use()
    if torch is not None:
        try:
            clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
            if clear is not None:
                clear()
            for src, d in snap.values:
                if src == "torch":
                    torch.cuda.synchronize(d)
        except Exception:
            pass
    cupy = sys.modules.get("cupy")
    if cupy is not None and "cupy" in snap.frameworks:
        try:
            cupy.cuda.runtime.deviceSynchronize()
        except Exception:
            pass


def _leaks(before, after, excluded):
    """(measured_by, total bytes, total count or None, {device: (bytes, count)})."""
    sources = after.frameworks or ["cupool"]
    delta = after.minus(before)
    per_device = {}
    for src, d in set(delta) | set(excluded):
        if src not in sources:
            continue
        b, c = delta.get((src, d), (0, 0))
        eb, ec = excluded.get((src, d), (0, 0))
        b0, c0 = per_device.get(d, (0, 0))
        c = None if c is None or ec is None or c0 is None else c0 + c - ec
        per_device[d] = (b0 + b - eb, c)
    leaked = {d: (b, c) for d, (b, c) in per_device.items() if b > 0}
    total = sum(b for b, _ in leaked.values())
    counts = [c for _, c in leaked.values()]
    count = None if any(c is None for c in counts) else sum(max(c, 0) for c in counts)
    return "+".join(sources), total, count, leaked


# ---------------------------------------------------------------------------
# The results file


class _Results:
    """``cupool-tests.<pid>.json``, written a line per test.

    The first line opens the document, each test is a line, the last line
    closes it: a process that dies mid-run leaves every finished test
    readable (``cupool check`` reads a file cut short).
    """

    def __init__(self, log_dir, worker, run_id):
        self.log_dir = log_dir
        self.worker = worker
        self.run_id = run_id
        self.pid = os.getpid()
        self.file = None
        self.path = None
        self.count = 0
        self.broken = False

    def _open(self):
        os.makedirs(self.log_dir, exist_ok=True)
        n = 0
        while True:
            name = "cupool-tests.%d.json" % self.pid if n == 0 else "cupool-tests.%d.%d.json" % (self.pid, n)
            path = os.path.join(self.log_dir, name)
            try:
                self.file = open(path, "x", encoding="utf-8")
                break
            except FileExistsError:
                n += 1
        self.path = path
        head = {"schema": SCHEMA, "version": VERSION, "pid": self.pid, "worker": self.worker, "run_id": self.run_id}
        self.file.write(json.dumps(head, separators=(",", ":"))[:-1] + ',"tests":[\n')

    def add(self, record):
        # A forked child inherits the plugin; only the process that ran pytest writes.
        if self.broken or os.getpid() != self.pid:
            return
        try:
            if self.file is None:
                self._open()
            self.file.write(("," if self.count else "") + json.dumps(record, separators=(",", ":")) + "\n")
            self.file.flush()
            self.count += 1
        except OSError as e:
            self.broken = True
            sys.stderr.write("cupool: cannot write per-test results into %s: %s\n" % (self.log_dir, e))

    def close(self):
        if self.file is None or os.getpid() != self.pid:
            return
        try:
            self.file.write('],"complete":true}\n')
            self.file.close()
        except OSError:
            pass
        self.file = None


# ---------------------------------------------------------------------------
# The checker


class LeakCheck:
    def __init__(self, log_dir, worker, run_id=""):
        self.results = _Results(log_dir, worker, run_id)
        from cupool import _lookup

        self.api = _lookup()
        # Wider-scoped fixture setups and teardowns inside the current test:
        # how deep they nest, the counters when the outermost began, and what
        # they changed, all together.
        self.depth = 0
        self.window_start = None
        self.excluded = {}
        self.teardowns = {}
        self.outcome = {}
        self.item = None
        # Garbage left by an unchecked test would be collected inside the
        # next one and hide its leaks: collect before that test's baseline.
        self.collect_first = True

    def _phase_begin(self, name):
        if self.api and self.api.phase_begin is not None:
            self.api.phase_begin(name.encode("utf-8", "replace"))

    def _phase_end(self):
        if self.api and self.api.phase_end is not None:
            self.api.phase_end()

    # Wider-scoped fixtures ---------------------------------------------------

    def _window_open(self, name):
        self._phase_begin(name)
        if self.depth == 0:
            self.window_start = _snapshot()
        self.depth += 1

    def _window_close(self):
        if self.depth == 0:
            return
        self.depth -= 1
        if self.depth == 0:
            _add(self.excluded, _snapshot().minus(self.window_start))
            self.window_start = None
        self._phase_end()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        scope = str(getattr(fixturedef, "scope", "function"))
        if scope == "function":
            yield
            return
        name = "%s%s:%s" % (_FIXTURE_PREFIX, scope, fixturedef.argname)
        self._window_open(name)
        try:
            outcome = yield
        finally:
            self._window_close()
        if outcome.excinfo is None:
            # Finalizers run last-in first-out: this one runs just before the
            # fixture's own teardown (registered while it was set up), and
            # pytest_fixture_post_finalizer comes right after that teardown.
            key = id(fixturedef)

            def teardown_begins():
                self.teardowns[key] = True
                self._window_open(name)

            fixturedef.addfinalizer(teardown_begins)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_post_finalizer(self, fixturedef, request):
        yield
        if not self.teardowns.pop(id(fixturedef), None):
            return
        # The value outlives its teardown: pytest drops its cached copy just
        # after this hook and the test's copy (item.funcargs) at the end of the
        # test. Freed then, it would count against the test, offsetting a leak
        # of its own; dropped here (as pytest is about to), it is freed inside
        # the window.
        cached = getattr(fixturedef, "cached_result", None)
        funcargs = getattr(self.item, "funcargs", None)
        if cached is not None and isinstance(funcargs, dict):
            if funcargs.get(fixturedef.argname, funcargs) is cached[0]:
                del funcargs[fixturedef.argname]
        if cached is not None:
            fixturedef.cached_result = None
        del cached
        self._window_close()

    # Tests -------------------------------------------------------------------

    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.outcome[report.nodeid] = "failed"
        elif report.skipped and self.outcome.get(report.nodeid) != "failed":
            self.outcome[report.nodeid] = "skipped"
        elif report.when == "call" and report.nodeid not in self.outcome:
            self.outcome[report.nodeid] = "passed"

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item, nextitem):
        check = item.get_closest_marker(MARKER) is None
        self._phase_begin(_PHASE_PREFIX + item.nodeid)
        before = None
        if check:
            if self.collect_first:
                gc.collect()
            before = _snapshot()
        self.excluded = {}
        self.item = item
        try:
            yield
        finally:
            self.item = None
            # A window pytest never closed would skew every later test.
            while self.depth:
                self._window_close()
            self.teardowns.clear()
            if check:
                self._record(item, before)
            self.collect_first = not check
            self._phase_end()

    def _record(self, item, before):
        marker = item.get_closest_marker(LIMIT_MARKER)
        limit = str(marker.args[0]) if marker is not None and marker.args else None
        after = _snapshot()
        measured_by, total, count, leaked = _leaks(before, after, self.excluded)
        for collect in (False, True):
            if total <= 0:
                break
            _settle(after, collect)
            after = _snapshot()
            measured_by, total, count, leaked = _leaks(before, after, self.excluded)
        self.results.add(
            {
                "nodeid": item.nodeid,
                "outcome": self.outcome.pop(item.nodeid, "passed"),
                "leaked_bytes": total,
                "leaked_count": count,
                "measured_by": measured_by,
                "devices": {
                    str(d): {"leaked_bytes": b, "leaked_count": None if c is None else max(c, 0)}
                    for d, (b, c) in sorted(leaked.items())
                },
                # Judged by cupool check, from the log: the plugin cannot see a peak without resetting the
                # program's own peak counters, which would change what the program reads.
                "limit": limit,
            }
        )

    def pytest_sessionfinish(self, session):
        self.results.close()

    def pytest_unconfigure(self, config):
        self.results.close()

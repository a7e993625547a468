"""cupool's figures from inside a program run under ``cupool run``.

The preload shim (libcupool.so) exports a small C API; this module reads it
through ``ctypes.CDLL(None)``, i.e. the symbols already loaded in this process.
Names follow ``torch.cuda``::

    import cupool

    @cupool.track_peak
    def step(batch): ...

    with cupool.phase("epoch 3"):
        step(batch)
    print(cupool.max_memory_allocated(), cupool.memory_stats()["reserved_bytes.all.peak"])

Not started under cupool, every function is a no-op that returns zeros (or an
empty dict) and warns once.
"""

import contextlib
import ctypes
import functools
import sys
import threading
import warnings

__all__ = [
    "available",
    "api_version",
    "memory_stats",
    "reset_peak_memory_stats",
    "max_memory_allocated",
    "memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "track_peak",
    "PeakReport",
    "phase",
    "phase_begin",
    "phase_end",
    "mark",
]

try:  # the version of the wheel this module came with
    from importlib.metadata import version as _version

    __version__ = _version("cupool")
except Exception:  # pragma: no cover - run from a source tree
    __version__ = "0+unknown"


class _Stats(ctypes.Structure):
    """``struct cupool_memory_stats`` (``src/intercept/stats.rs``)."""

    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "allocated_bytes",
            "peak_allocated_bytes",
            "reserved_bytes",
            "peak_reserved_bytes",
            "allocations",
            "peak_allocations",
            "num_allocs",
            "num_frees",
            "num_alloc_failures",
        )
    ]


# torch.cuda.memory_stats key -> struct field.
_KEYS = {
    "allocated_bytes.all.current": "allocated_bytes",
    "allocated_bytes.all.peak": "peak_allocated_bytes",
    "reserved_bytes.all.current": "reserved_bytes",
    "reserved_bytes.all.peak": "peak_reserved_bytes",
    "allocation.all.current": "allocations",
    "allocation.all.peak": "peak_allocations",
    "allocation.all.allocated": "num_allocs",
    "allocation.all.freed": "num_frees",
    "num_alloc_failures": "num_alloc_failures",
}

_NOT_UNDER_CUPOOL = (
    "cupool: this process was not started under cupool (libcupool.so is not loaded), so "
    "cupool's functions do nothing and report zeros; run it as `cupool run -- python ...`"
)

_lock = threading.Lock()
_api = None  # None: not looked up yet; False: absent; else a namespace of functions
_warned = False


class _Api:
    pass


def _lookup():
    global _api
    if _api is not None:
        return _api
    with _lock:
        if _api is not None:
            return _api
        try:
            process = ctypes.CDLL(None)
        except OSError:
            _api = False
            return _api
        api = _Api()

        def fn(name, restype, argtypes):
            try:
                f = getattr(process, name)
            except AttributeError:
                return None
            f.restype = restype
            f.argtypes = argtypes
            return f

        api.version = fn("cupool_api_version", ctypes.c_int, [])
        api.stats = fn("cupool_memory_stats", ctypes.c_int, [ctypes.c_int, ctypes.POINTER(_Stats), ctypes.c_size_t])
        api.reset = fn("cupool_reset_peak_memory_stats", None, [ctypes.c_int])
        # Newer shims only; absent ones make phase() and mark() plain no-ops.
        api.phase_begin = fn("cupool_phase_begin", None, [ctypes.c_char_p])
        api.phase_end = fn("cupool_phase_end", None, [])
        api.mark = fn("cupool_mark", None, [ctypes.c_char_p])
        _api = api if api.version is not None and api.stats is not None else False
        return _api


def _get():
    """The shim's API, or None (after warning once) when it is not loaded."""
    global _warned
    api = _lookup()
    if api:
        return api
    if not _warned:
        _warned = True
        warnings.warn(_NOT_UNDER_CUPOOL, RuntimeWarning, stacklevel=_callers_level())
    return None


# Frames that are cupool's own, or the machinery of ``with cupool.phase(...)``
# and ``@cupool.track_peak``, which a warning should point past.
_OWN_FILES = frozenset({__file__, contextlib.__file__})


def _callers_level():
    """The ``stacklevel`` that makes a warning raised in :func:`_get` point at
    the first frame outside cupool: the program's line that called it."""
    level, frame = 1, sys._getframe(1)  # the frame of _get
    while frame is not None and frame.f_code.co_filename in _OWN_FILES:
        frame, level = frame.f_back, level + 1
    return level


def available():
    """True when this process runs under cupool (the shim's API is loaded). Never warns."""
    return bool(_lookup())


def api_version():
    """The shim's C API version (1 and up), or 0 when not under cupool."""
    api = _get()
    return int(api.version()) if api else 0


def _raw(device):
    api = _get()
    s = _Stats()
    if api is None:
        return s
    if api.stats(int(device), ctypes.byref(s), ctypes.sizeof(s)) != 0:
        raise ValueError(f"cupool: no such device: {device!r}")
    return s


def memory_stats(device=0):
    """Device memory figures, named like ``torch.cuda.memory_stats``.

    Keys: ``allocated_bytes.all.current``/``.peak`` (live in the program's
    allocations), ``reserved_bytes.all.current``/``.peak`` (held from CUDA:
    pool segments plus direct allocations), ``allocation.all.current``/
    ``.peak``/``.allocated``/``.freed`` (counts) and ``num_alloc_failures``.
    All zeros when not under cupool. ValueError for a device out of range.
    """
    s = _raw(device)
    return {key: int(getattr(s, field)) for key, field in _KEYS.items()}


def memory_allocated(device=0):
    """Bytes live in the program's device allocations now."""
    return int(_raw(device).allocated_bytes)


def max_memory_allocated(device=0):
    """Peak of :func:`memory_allocated` since the start or the last reset."""
    return int(_raw(device).peak_allocated_bytes)


def memory_reserved(device=0):
    """Bytes held from CUDA now (pool segments plus direct allocations)."""
    return int(_raw(device).reserved_bytes)


def max_memory_reserved(device=0):
    """Peak of :func:`memory_reserved` since the start or the last reset."""
    return int(_raw(device).peak_reserved_bytes)


def reset_peak_memory_stats(device=0):
    """Start the peaks again from what is held now."""
    api = _get()
    if api is not None:
        api.reset(int(device))


def _encode(name):
    return name.encode("utf-8", "replace") if isinstance(name, str) else bytes(name)


# Called as hook(edge, name) just before a phase edge ("begin", "end" or
# "mark") reaches the log: a recorder that samples the program's objects
# (cupool.jax_history) looks at them at the loop's edges as well.
_edge_hooks = []


def _edge(edge, name):
    for hook in _edge_hooks:
        try:
            hook(edge, name if isinstance(name, str) else bytes(name).decode("utf-8", "replace"))
        except Exception:
            pass


def phase_begin(name):
    """Begins a phase named ``name`` in the log (``cupool_phase_begin``); phases nest.

    Each needs its :func:`phase_end`; :func:`phase` pairs them for a ``with``
    block. A no-op with an older shim, or not under cupool.
    """
    api = _get()
    if api is not None and api.phase_begin is not None:
        _edge("begin", name)
        api.phase_begin(_encode(name))


def phase_end():
    """Ends the innermost phase begun by :func:`phase_begin` (``cupool_phase_end``)."""
    api = _get()
    if api is not None and api.phase_end is not None:
        _edge("end", "")
        api.phase_end()


@contextlib.contextmanager
def phase(name):
    """``with cupool.phase("epoch 3"):`` marks a phase of the program in the log.

    Calls the shim's ``cupool_phase_begin``/``cupool_phase_end`` when it has
    them; with an older shim, or not under cupool, it is a plain no-op.
    """
    api = _get()
    begin = api.phase_begin if api is not None else None
    end = api.phase_end if api is not None else None
    if begin is not None:
        _edge("begin", name)
        begin(_encode(name))
    try:
        yield
    finally:
        if begin is not None and end is not None:
            _edge("end", name)
            end()


def mark(name):
    """Puts a named instant in the log (``cupool_mark``), when the shim has it."""
    api = _get()
    if api is not None and api.mark is not None:
        _edge("mark", name)
        api.mark(_encode(name))


class PeakReport:
    """What :func:`track_peak` hands to its ``report`` callback.

    ``name`` (the function's qualified name), ``peak_bytes`` (its peak of
    allocated bytes) and ``device``; ``str()`` gives one readable line.
    """

    __slots__ = ("name", "peak_bytes", "device")

    def __init__(self, name, peak_bytes, device):
        self.name, self.peak_bytes, self.device = name, peak_bytes, device

    def __str__(self):
        return f"cupool: {self.name}: peak {_human(self.peak_bytes)} allocated on device {self.device}"

    __repr__ = __str__


def _human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def track_peak(func=None, *, device=0, report=None):
    """Decorator: resets the peaks, runs the function, reports its peak.

    ``@cupool.track_peak`` or ``@cupool.track_peak(device=0, report=print)``.
    The wrapped function returns what the function returns. After each call
    (also one that raises) the peak of allocated bytes during that call
    (``max_memory_allocated`` while it ran) is kept in ``wrapper.last_peak``,
    and ``report`` (when given) is called with a :class:`PeakReport`, whose
    ``str()`` is one readable line. Zeros when not under cupool. The device's
    peaks are reset on entry: an enclosing ``track_peak`` sees only what
    happened after that.
    """

    def decorate(f):
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            reset_peak_memory_stats(device)
            try:
                return f(*args, **kwargs)
            finally:
                wrapper.last_peak = max_memory_allocated(device)
                if report is not None:
                    report(PeakReport(getattr(f, "__qualname__", repr(f)), wrapper.last_peak, device))

        wrapper.last_peak = 0
        return wrapper

    return decorate(func) if func is not None else decorate


def pytest_configure(config):
    """``pytest -p cupool`` names this package: the plugin is :mod:`cupool.pytest_plugin`.

    Imported only here, so that ``import cupool`` does not import pytest.
    """
    from . import pytest_plugin

    pytest_plugin.pytest_configure(config)

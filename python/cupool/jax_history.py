"""JAX's live arrays over time, for ``cupool check``.

JAX carves its arrays from an arena (XLA's BFC allocator) that grows in a
few large allocations as the program warms up and then keeps them: cupool
sees the arena, not the arrays, and arena growth looks the same whether
the program keeps arrays or not. JAX itself keeps, for every live array,
the Python traceback of the call that made it (``jax.Array.traceback``).
Under ``cupool check`` (the carried ``sitecustomize``) this module samples
``jax.live_arrays()`` in every Python process that imports JAX and uses a
device, every ``jax_history_ms`` milliseconds and once at exit, and writes
what it saw beside the process's cupool log as an allocation history:
an array that appears is an allocation at its Python line, one that is
gone is freed (``<log_dir>/cupool-jax.<pid>.json``, schema ``cupool-jax``,
the shape of ``cupool-torch``: docs/log-schema.md). ``cupool check`` then
judges growth from the arrays, by the rule it applies to PyTorch's tensors,
and names the line that made the arrays kept.

An array is placed in time at the sample that first saw it: one that lives
less than a period may be missed (what leaks lives on, and a clean loop's
temporaries do not matter to the rule), and the arrays of a loop whose
steps are shorter than the period are seen a batch at a time. Arrays first
seen together were, for all the record tells, made at once, which is not
growth step by step; so the recorder also samples at every phase edge made
with cupool's API (``cupool.mark``, ``cupool.phase``) and keeps those edges
in its record, which places each array in its step however fast the loop.
Sampling never starts a backend: until JAX has one, a sample does nothing.
Nothing here raises into the program or prints, except notes on stderr
with ``verbosity=2``.
"""

import collections
import os
import sys
import threading
import time
import weakref

from cupool._options import DEFAULTS, integer, option
from cupool._record import Stacks, check_options, trim, write

SCHEMA = "cupool-jax"
VERSION = 1
DEFAULT_DEPTH = int(DEFAULTS["python_depth"])

_state = {"started": False}
_lock = threading.Lock()


def _note(text):
    if _state.get("verbose"):
        try:
            sys.stderr.write("cupool: JAX history: %s\n" % text)
        except Exception:
            pass


def jax_imported(jax):
    """Called once ``jax/__init__`` has run. Never raises."""
    try:
        _prepare(jax)
    except Exception as e:
        _note("not recorded: %r" % (e,))


def _prepare(jax):
    if _state["started"]:
        return
    opts = check_options()
    if opts is None:
        return
    _state["verbose"] = integer(opts.get("verbosity"), int(DEFAULTS["verbosity"])) >= 2
    period_ms = integer(opts.get("jax_history_ms"), int(DEFAULTS["jax_history_ms"]))
    entries = integer(opts.get("jax_history"), int(DEFAULTS["jax_history"]))
    depth = integer(opts.get("python_depth"), DEFAULT_DEPTH)
    if min(period_ms, entries) <= 0:
        return
    import cupool

    if not cupool.available():
        return
    if depth <= 0:
        _note("python_depth=0: no stacks to name arrays by, not recorded")
        return
    _state.update(
        started=True,
        jax=jax,
        pid=os.getpid(),
        period=period_ms / 1000.0,
        depth=depth,
        log_dir=os.path.abspath(option(opts, "log_dir")),
        run_id=option(opts, "run_id"),
        live={},  # id(array) -> (key, nbytes, device, stack, weak reference)
        next_key=1,
        stacks=Stacks(),
        entries=entries,
        # device -> a ring of [action, key, size, time_us, stack]: a long run
        # keeps its last events, in bounded memory.
        events={},
        # [[edge, name, time_us], ...]: phases made with cupool's API, the
        # last ones as the events are.
        edges=collections.deque(maxlen=entries),
        samples=0,
    )
    cupool._edge_hooks.append(_at_edge)
    import atexit

    atexit.register(_at_exit)
    t = threading.Thread(target=_sampler, name="cupool-jax-history", daemon=True)
    t.start()


def _has_backend(jax):
    """Whether JAX has started a backend: sampling must never start one."""
    try:
        from jax._src import xla_bridge

        return bool(getattr(xla_bridge, "_backends", None))
    except Exception:
        return False


def _sampler():
    while True:
        time.sleep(_state["period"])
        if _state.get("pid") != os.getpid() or _state.get("done"):
            return
        _sample()


def _stack_of(array):
    tb = getattr(array, "traceback", None)
    frames = getattr(tb, "frames", None) if tb is not None else None
    if not frames:
        return None
    key = trim([(str(f.function_name), str(f.file_name), int(f.line_num or 0)) for f in frames], _state["depth"])
    return _state["stacks"].id_of(key)


def _device_of(array):
    try:
        devices = array.devices()
        return min(int(d.id) for d in devices) if devices else 0
    except Exception:
        return 0


def _sample():
    """One look at the live arrays: those new since the last are allocations,
    those gone are frees, stamped with Unix time (as PyTorch's history is)."""
    jax = _state["jax"]
    if not _has_backend(jax):
        return
    with _lock:
        try:
            arrays = jax.live_arrays()
        except Exception:
            return
        now_us = time.time_ns() // 1000
        live = _state["live"]
        seen = {}
        for a in arrays:
            try:
                if getattr(a, "is_deleted", lambda: False)():
                    continue
                oid = id(a)
                nbytes = int(a.nbytes)
                old = live.get(oid)
                # An id outlives its array: a new array often gets the id of
                # one that died since the last sample, so the array itself
                # is compared (by a weak reference: the record keeps nothing alive).
                if old is not None and old[1] == nbytes and _same(old[4], a):
                    seen[oid] = old
                    continue
                entry = (_state["next_key"], nbytes, _device_of(a), _stack_of(a), _ref(a))
                _state["next_key"] += 1
                seen[oid] = entry
                _event("alloc", entry, now_us)
            except Exception:
                continue
        del arrays
        for oid, entry in live.items():
            if seen.get(oid) is not entry:
                _event("free_requested", entry, now_us)
        _state["live"] = seen
        _state["samples"] += 1


def _at_edge(edge, name):
    """A phase edge made with cupool's API: a sample now, and the edge in
    the record, in the samples' clock, so that arrays made in a step are
    placed in it however fast the loop runs."""
    if _state.get("pid") != os.getpid() or _state.get("done"):
        return
    _sample()
    with _lock:
        _state["edges"].append([edge, name, time.time_ns() // 1000])


def _ref(array):
    try:
        return weakref.ref(array)
    except TypeError:
        return None


def _same(ref, array):
    return ref is not None and ref() is array


def _event(action, entry, now_us):
    key, nbytes, device, stack, _ = entry
    _state["events"].setdefault(device, collections.deque(maxlen=_state["entries"])).append(
        [action, key, nbytes, now_us, stack if action == "alloc" else None]
    )


def _at_exit():
    if _state.get("pid") != os.getpid():
        return
    try:
        _sample()
        _state["done"] = True
        if not _state["samples"]:
            return  # JAX never used a device here
        jax = _state["jax"]
        doc = {
            "schema": SCHEMA,
            "version": VERSION,
            "pid": os.getpid(),
            "run_id": _state["run_id"],
            "jax": str(getattr(jax, "__version__", "")),
            "period_ms": int(_state["period"] * 1000),
            "max_entries": _state["entries"],
            "stacks": _state["stacks"].listed,
            "devices": [
                {"device": d, "events": list(e), "full": len(e) == e.maxlen}
                for d, e in sorted(_state["events"].items())
            ],
            "segments": [],
            "phases": list(_state["edges"]),
        }
        path = write(_state["log_dir"], os.getpid(), doc, stem=SCHEMA)
        _note("wrote %s" % path)
    except Exception as e:
        _note("not written: %r" % (e,))

"""PyTorch's own allocation history, for ``cupool check``.

With PyTorch's caching allocator on (the default), a tensor is carved from
memory the cache already holds: cupool sees the cache's segments, not the
tensors, so a growth leak it finds there names the line where the cache had
to grow. PyTorch can record every tensor allocation and free itself, with
its Python stack (``torch.cuda.memory._record_memory_history``). Under
``cupool check`` (the carried ``sitecustomize``) this module switches that
on in every Python process that imports torch and then starts CUDA, and at
exit writes the history, reduced to what the check needs, beside the
process's cupool log: ``<log_dir>/cupool-torch.<pid>.json`` (schema
``cupool-torch``, docs/log-schema.md). ``cupool check`` then judges growth
inside the cache from the tensors, at their own Python lines.

Nothing happens unless the process runs under cupool with a log
(``CUPOOL_OPTIONS``), ``torch_history`` is not 0, and PyTorch uses its
native caching allocator with the cache on: without the cache
(``PYTORCH_NO_CUDA_MEMORY_CACHING=1``) or on ``backend:cudaMallocAsync``
every tensor is a CUDA allocation cupool sees with its own site already.
Recording starts when PyTorch initialises CUDA (``torch.cuda._lazy_call``),
never earlier: switching it on at import would start CUDA in processes that
never use it. Nothing here raises into the program or prints, except notes
on stderr with ``verbosity=2``.
"""

import os
import sys
import threading

from cupool._options import DEFAULTS, integer, option
from cupool._record import Stacks, check_options, trim, write

SCHEMA = "cupool-torch"
VERSION = 1
# The default of the `torch_history` option: entries of PyTorch's history
# kept per device, a ring buffer.
DEFAULT_ENTRIES = int(DEFAULTS["torch_history"])
# The default of `python_depth`: frames kept per stack.
DEFAULT_DEPTH = int(DEFAULTS["python_depth"])
# The actions the check reads; PyTorch's others (snapshot, oom, ...) are dropped.
_ACTIONS = frozenset(
    (
        "alloc",
        "free_requested",
        "free_completed",
        "segment_alloc",
        "segment_free",
        "segment_map",
        "segment_unmap",
    )
)

_state = {"started": False}


def _note(text):
    if _state.get("verbose"):
        try:
            sys.stderr.write("cupool: PyTorch history: %s\n" % text)
        except Exception:
            pass


def _truthy(value):
    return (value or "").strip().lower() in ("1", "true", "yes", "on", "y", "t")


def _cache_off():
    """PyTorch's caching allocator is off, or is not its native one."""
    for var in ("PYTORCH_NO_CUDA_MEMORY_CACHING", "PYTORCH_NO_HIP_MEMORY_CACHING"):
        if _truthy(os.environ.get(var)):
            return True
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"):
        conf = (os.environ.get(var) or "").replace(" ", "")
        if "backend:cudaMallocAsync" in conf:
            return True
    return False


def torch_imported(torch):
    """Called once ``torch/__init__`` has run: arranges for the history to be
    recorded from the moment PyTorch starts CUDA. Never raises."""
    try:
        _prepare(torch)
    except Exception as e:  # never into the program
        _note("not recorded: %r" % (e,))


def _prepare(torch):
    if _state["started"]:
        return
    opts = check_options()
    if opts is None:
        return  # not started by cupool check (which tags its runs), or no log to sit beside
    _state["verbose"] = integer(opts.get("verbosity"), int(DEFAULTS["verbosity"])) >= 2
    entries = integer(opts.get("torch_history"), DEFAULT_ENTRIES)
    depth = integer(opts.get("python_depth"), DEFAULT_DEPTH)
    if entries <= 0:
        return
    import cupool

    if not cupool.available():
        return  # the shim is not loaded: no log of this process
    if depth <= 0:
        _note("python_depth=0: no stacks to name tensors by, not recorded")
        return
    if _cache_off():
        _note("PyTorch's caching allocator is off or not native: every tensor is seen by cupool itself")
        return
    lazy_call = getattr(getattr(torch, "cuda", None), "_lazy_call", None)
    if lazy_call is None:
        _note("this torch has no torch.cuda._lazy_call: not recorded")
        return
    _state.update(
        started=True,
        entries=entries,
        depth=depth,
        log_dir=os.path.abspath(option(opts, "log_dir")),
        run_id=option(opts, "run_id"),
    )
    lazy_call(_begin)


def _begin():
    """Runs inside ``torch.cuda._lazy_init``, right after CUDA started: an
    exception here would become the program's, so none leaves."""
    try:
        if _cache_off():  # set by the program after it imported torch
            _note("PyTorch's caching allocator is off or not native: every tensor is seen by cupool itself")
            return
        torch = sys.modules.get("torch")
        memory = torch.cuda.memory
        backend = getattr(memory, "get_allocator_backend", None)
        if backend is not None and backend() != "native":
            _note("allocator backend %s: not recorded" % backend())
            return
        memory._record_memory_history(
            enabled="all", context="alloc", stacks="python", max_entries=_state["entries"]
        )
        _state["pid"] = os.getpid()
        import atexit

        atexit.register(_at_exit)
        _note("recording (at most %d events per device)" % _state["entries"])
    except Exception as e:
        _note("not recorded: %r" % (e,))


def _at_exit():
    # A forked child inherits the handler; only the process that recorded writes.
    if _state.get("pid") != os.getpid():
        return
    try:
        torch = sys.modules.get("torch")
        snapshot = _snapshot_without_inductor(torch)
        doc = reduce(snapshot, _state["depth"], _state["entries"])
        doc.update(
            pid=os.getpid(),
            run_id=_state["run_id"],
            torch=str(getattr(torch, "__version__", "")),
            max_entries=_state["entries"],
        )
        path = write(_state["log_dir"], os.getpid(), doc, stem=SCHEMA)
        _note("wrote %s" % path)
    except Exception as e:
        _note("not written: %r" % (e,))


def _snapshot_without_inductor(torch):
    """``torch.cuda.memory._snapshot()``, without the import of
    ``torch._inductor`` it would otherwise set off. To name the frames of
    code that inductor compiled, PyTorch asks ``hasattr(torch,
    "_inductor")``, and torch's lazy module ``__getattr__`` answers by
    importing it: sympy, dynamo and a thousand modules, seconds of a short
    job, where the program never compiled anything. While the snapshot is
    taken, and for this thread only, that one lazy name is missing; every
    other thread, and everything after, sees torch unchanged. A program
    that imported inductor keeps its frames named as before."""
    lazy = torch.__dict__.get("__getattr__")
    if "torch._inductor" in sys.modules or lazy is None:
        return torch.cuda.memory._snapshot()
    this_thread = threading.get_ident()

    def without_inductor(name):
        if name == "_inductor" and threading.get_ident() == this_thread:
            raise AttributeError(name)
        return lazy(name)

    torch.__getattr__ = without_inductor
    try:
        return torch.cuda.memory._snapshot()
    finally:
        if torch.__dict__.get("__getattr__") is without_inductor:
            torch.__getattr__ = lazy


def reduce(snapshot, depth, entries):
    """What the check needs of ``torch.cuda.memory._snapshot()``: per device,
    events ``[action, addr, size, time_us, stack]`` (``stack`` an index into
    ``stacks``, or None), each distinct Python stack once as
    ``[[function, file, line], ...]`` (innermost first, at most ``depth``
    frames, see `trim`), and the segments the cache held at the end."""
    stacks = Stacks()
    by_list = {}
    devices = []
    for device, trace in enumerate(snapshot.get("device_traces") or ()):
        events = []
        for e in trace:
            action = e.get("action")
            if action not in _ACTIONS:
                continue
            stack = None
            frames = e.get("frames") if action == "alloc" else None
            if frames:
                # Identical stacks often share one list object: look it up by identity first.
                stack = by_list.get(id(frames))
                if stack is None:
                    key = trim(
                        [(str(f.get("name", "")), str(f.get("filename", "")), int(f.get("line", 0) or 0)) for f in frames],
                        depth,
                    )
                    stack = by_list[id(frames)] = stacks.id_of(key)
            events.append([action, int(e.get("addr", 0)), int(e.get("size", 0)), int(e.get("time_us", 0)), stack])
        devices.append({"device": device, "events": events, "full": len(trace) >= entries})
    segments = [
        [int(s.get("device", 0)), int(s.get("address", 0)), int(s.get("total_size", 0))]
        for s in snapshot.get("segments") or ()
    ]
    return {"schema": SCHEMA, "version": VERSION, "stacks": stacks.listed, "devices": devices, "segments": segments}



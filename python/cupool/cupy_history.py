"""CuPy's arrays, for ``cupool check``.

CuPy carves its arrays from a memory pool (on by default) that takes
memory from the device in chunks and keeps them: cupool sees the chunks,
not the arrays, so a growth leak found there names whichever line made
the pool grow, often not the one that keeps arrays. Under ``cupool check``
(the carried ``sitecustomize``) this module wraps CuPy's current allocator
(``cupy.cuda.set_allocator``, process-wide) in every Python process that
imports CuPy: each allocation is recorded with its Python stack, and its
free when the program lets go of the memory (the last reference to it
goes, in whichever thread), stamped with Unix time as PyTorch's history
is. At exit the record is written beside the process's cupool log:
``<log_dir>/cupool-cupy.<pid>.json`` (schema ``cupool-cupy``, the shape of
``cupool-torch``: docs/log-schema.md). ``cupool check`` then judges growth
inside the pool from the arrays and names the line that made those kept.

The wrapper hands the program memory of the same pool, at the same address
and on the same device; only the object that owns it is another
(``cupy.cuda.UnownedMemory`` holding the pool's own). A program that sets
an allocator of its own replaces the wrapper; then nothing is written, and
the check judges the log as without the record. Nothing here raises into
the program or prints, except notes on stderr with ``verbosity=2``.
"""

import collections
import os
import sys
import threading
import time

from cupool._options import DEFAULTS, integer, option
from cupool._record import Stacks, _is_library, check_options, trim, write

SCHEMA = "cupool-cupy"
VERSION = 1
DEFAULT_DEPTH = int(DEFAULTS["python_depth"])
# Frames looked at for the program's own line past the ones kept (see
# `cupool._record.trim`).
_DEEPEST = 256
# Stacks known by their code and instructions (`_stack`) before all are
# forgotten: a program that compiles code as it runs makes new ones. An
# entry takes about 1.5 KB at the default depth; real programs allocate
# from hundreds of stacks.
_KNOWN_STACKS = 1 << 12

_state = {"started": False}


def _note(text):
    if _state.get("verbose"):
        try:
            sys.stderr.write("cupool: CuPy history: %s\n" % text)
        except Exception:
            pass


def cupy_imported(cupy):
    """Called once ``cupy/__init__`` has run. Never raises."""
    try:
        _prepare(cupy)
    except Exception as e:
        _note("not recorded: %r" % (e,))


def _prepare(cupy):
    if _state["started"]:
        return
    opts = check_options()
    if opts is None:
        return
    _state["verbose"] = integer(opts.get("verbosity"), int(DEFAULTS["verbosity"])) >= 2
    depth = integer(opts.get("python_depth"), DEFAULT_DEPTH)
    entries = integer(opts.get("cupy_history"), int(DEFAULTS["cupy_history"]))
    if entries <= 0:
        return
    import cupool

    if not cupool.available():
        return
    if depth <= 0:
        _note("python_depth=0: no stacks to name arrays by, not recorded")
        return
    from cupy.cuda import memory

    inner = memory.get_allocator()
    if inner is None:
        return
    _state.update(
        recorded_memory=_memory_class(memory),
        entries=entries,
        started=True,
        pid=os.getpid(),
        depth=depth,
        log_dir=os.path.abspath(option(opts, "log_dir")),
        run_id=option(opts, "run_id"),
        cupy=cupy,
        memory=memory,
        inner=inner,
        stacks=Stacks(),
        # (code id, instruction, ..., whole) of a stack's frames -> (its
        # stack's id, or -1 where frames past them name it; their code
        # objects): see `_stack`.
        known_stacks={},
        # device -> [(action, address, size, time_us, stack), ...]: tuples of
        # numbers and text, which the garbage collector stops tracking.
        events={},
        allocations=0,
    )
    memory.set_allocator(_allocate)
    import atexit
    import weakref

    # A forked child records nothing (its parent writes the record): said
    # once at the fork, not asked of every allocation.
    os.register_at_fork(after_in_child=lambda: _state.update(done=True))

    # CuPy empties its FFT plan cache in a weakref finalizer at exit. The
    # first finalizer made registers all of theirs with atexit, whose hooks
    # run last registered first: one made now, before this module's hook,
    # has the cache emptied after the record looked at it (`_held_by_plans`).
    weakref.finalize(_at_exit, int)
    atexit.register(_at_exit)


class _Release(object):
    """Owns the pool's memory for the program: when the program lets go of
    the memory, this goes, the free is recorded, and the pool's own memory
    object goes back to the pool as it would have."""

    __slots__ = ("pooled", "events", "address", "size", "recorded")

    def __init__(self, pooled, events, address, size):
        self.pooled, self.events, self.address, self.size = pooled, events, address, size
        self.recorded = False

    def freed(self):
        if self.recorded:
            self.recorded = False
            self.events.append(("free_requested", self.address, self.size, time.time_ns() // 1000, None))

    def __del__(self):
        try:
            self.freed()
        except Exception:
            pass


def _memory_class(memory):
    class RecordedMemory(memory.UnownedMemory):
        """The pool's memory as the program sees it: CuPy's ``UnownedMemory``
        over the same bytes, with the attributes of the pool's own memory
        object (``pool``, ``identity``, ...) read through to it, and its
        ``free`` recorded."""

        # No instance dictionary: one object fewer for each array (weak
        # references to it still work, as to CuPy's own).
        __slots__ = ("_release",) + (() if memory.UnownedMemory.__weakrefoffset__ else ("__weakref__",))

        def __getattr__(self, name):
            # Only for names found nowhere else; `_release` unset is not the
            # pool's to answer.
            if name == "_release":
                raise AttributeError(name)
            return getattr(self._release.pooled.mem, name)

        def free(self):
            release = self._release
            release.freed()
            release.pooled.mem.free()

    return RecordedMemory


_inside = threading.local()


def _allocate(size):
    pooled = _state["inner"](size)
    if _state.get("done") or getattr(_inside, "busy", False):
        # A forked child, the end, or an allocation made while one is being
        # recorded (a finalizer or a signal handler run meanwhile): not recorded.
        return pooled
    _inside.busy = True
    try:
        address, device = int(pooled.ptr), int(pooled.device_id)
        if address == 0:
            return pooled  # a zero-byte allocation: no memory to follow
        events = _state["events"].get(device)
        if events is None:
            # A ring: a long run keeps its last events, in bounded memory.
            events = _state["events"].setdefault(device, collections.deque(maxlen=_state["entries"]))
        owner = _Release(pooled, events, address, int(size))
        mem = _state["recorded_memory"](address, pooled.mem.size, owner, device)
        mem._release = owner
        wrapped = _state["memory"].MemoryPointer(mem, 0)
        stack = _stack(sys._getframe(1))
        owner.recorded = True
        events.append(("alloc", address, int(size), time.time_ns() // 1000, stack))
        _state["allocations"] += 1
        return wrapped
    except Exception as e:
        # What was recorded stays true; the record is not written, lest an
        # array handed out unwrapped, whose free it cannot see, look kept.
        _state["broken"] = repr(e)
        return pooled
    finally:
        _inside.busy = False


def _frames(frame):
    """The stack from ``frame`` out, as ``(function, file, line)``, read as asked."""
    for _ in range(_DEEPEST):
        if frame is None:
            return
        code = frame.f_code
        yield (code.co_name, code.co_filename, frame.f_lineno or 0)
        frame = frame.f_back


def _stack(frame):
    # Walking Python's frames is most of what a record costs. A stack seen
    # before is known by its frames' code objects and the instruction each
    # is at (its lines follow from those), which cost less to read than
    # names and lines.
    depth, known = _state["depth"], _state["known_stacks"]
    key, kept, f = [], [], frame
    for _ in range(depth):
        if f is None:
            break
        kept.append(f)
        key.append(id(f.f_code))
        key.append(f.f_lasti)
        f = f.f_back
    key.append(f is None)
    key = tuple(key)
    entry = known.get(key)
    if entry is not None and entry[0] >= 0:
        return entry[0]
    program = None
    completed = entry is not None
    if completed:
        # Every frame of the key in libraries: the program's first frame
        # past them names the stack (`trim`), and completes the key.
        program = _program_frame(f)
        key = key + ((id(program.f_code), program.f_lasti) if program is not None else None,)
        entry = known.get(key)
        if entry is not None:
            return entry[0]
    # Names and lines only for a stack not known, and past the frames kept
    # only to find the program's own.
    frames = [(fr.f_code.co_name, fr.f_code.co_filename, fr.f_lineno or 0) for fr in kept]
    at = _state["stacks"].id_of(trim(frames, depth, () if f is None else _frames(f)))
    # The entry keeps its code objects alive: while it is known, no other
    # code object can take one's id.
    codes = [fr.f_code for fr in kept] + ([program.f_code] if program is not None else [])
    if len(known) >= _KNOWN_STACKS:
        known.clear()  # programs that make code as they run: bounded
    if not completed and f is not None and all(_is_library(fr[1]) for fr in frames):
        known[key] = (-1, codes)  # to be completed by the program's frame, above
    else:
        known[key] = (at, codes)
    return at


def _program_frame(frame):
    """The first frame from ``frame`` out, of those ``trim`` reads, that is
    not in a library; None when there is none."""
    for _ in range(_DEEPEST):
        if frame is None or not _is_library(frame.f_code.co_filename):
            return frame
        frame = frame.f_back
    return None


def _held_by_plans():
    """Addresses of the work areas that CuPy's FFT plan cache holds at exit.

    The cache keeps its last plans (16 by default), each with a work area
    taken from the allocator when the plan was made: memory of a cache,
    which a loop over new FFT shapes fills step by step as a leak would.
    Plans the program keeps itself are not the cache's, and stay judged."""
    cache = sys.modules.get("cupy.fft._cache")
    node = getattr(cache, "_Node", None)
    if not isinstance(node, type):
        return set()
    import gc

    held = set()
    for entry in gc.get_objects():
        if isinstance(entry, node):
            area = getattr(getattr(entry, "plan", None), "work_area", None)
            for pointer in area if isinstance(area, list) else [area]:
                if pointer is not None:
                    held.add(int(pointer.ptr))
    return held


def _cached(events, addresses):
    """``events`` with each allocation at ``addresses`` still live at their
    end made ``cached``: memory a known cache held, which the check counts
    as the pool's but never as the program's growth."""
    live = {}
    for i, e in enumerate(events):
        if e[0] == "alloc":
            live[e[1]] = i
        else:
            live.pop(e[1], None)
    for address, i in live.items():
        if address in addresses:
            events[i] = ("cached",) + events[i][1:]
    return events


def _at_exit():
    if _state.get("pid") != os.getpid():
        return
    try:
        _state["done"] = True
        if _state.get("broken"):
            _note("an allocation could not be recorded (%s): not written" % _state["broken"])
            return
        if not _state["allocations"]:
            return  # CuPy allocated nothing here
        if _state["memory"].get_allocator() is not _allocate:
            # The program chose its allocator after the record began: what it
            # allocated since is in cupool's log alone, which is then judged
            # whole rather than in part from a record that stopped.
            _note("the program set its own allocator: not written")
            return
        try:
            plans = _held_by_plans()
        except Exception as e:
            _note("cuFFT plans not looked at: %r" % (e,))
            plans = set()
        doc = {
            "schema": SCHEMA,
            "version": VERSION,
            "pid": os.getpid(),
            "run_id": _state["run_id"],
            "cupy": str(getattr(_state["cupy"], "__version__", "")),
            "stacks": _state["stacks"].listed,
            "max_entries": _state["entries"],
            "devices": [
                {"device": d, "events": _cached(list(e), plans), "full": len(e) == e.maxlen}
                for d, e in sorted(_state["events"].items())
            ],
            "segments": [],
        }
        path = write(_state["log_dir"], os.getpid(), doc, stem=SCHEMA)
        _note("wrote %s" % path)
    except Exception as e:
        _note("not written: %r" % (e,))

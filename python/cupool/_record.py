"""What the framework recorders share (``torch_history``, ``jax_history``,
``cupy_history``): the options they start from, their stacks, cut to what
a finding needs and each kept once, and the file each writes at exit.
Imports nothing of a framework's.
"""

import itertools
import os
import threading

from cupool._options import flag, option, parse_options


def check_options():
    """``CUPOOL_OPTIONS`` of a process that ``cupool check`` runs with a log
    to sit beside (it tags its runs with ``run_id``), or None: then nothing
    is recorded."""
    opts = parse_options(os.environ.get("CUPOOL_OPTIONS", ""))
    if option(opts, "run_id") and flag(option(opts, "log"), True):
        return opts
    return None


# Where Python code that the program's authors did not write lies: installed
# packages, the standard library, code generated at run time (PyTorch's
# compiled graphs in its inductor cache), test runners and cupool. As
# cupool check tells frames apart (cli/src/sites.rs, `ShownFrame::origin`).
_LIBRARY = (
    "site-packages/",
    "dist-packages/",
    "/lib/python3",
    "/lib64/python3",
    "/torchinductor_",
    "/_pytest/",
    "/pluggy/",
    "/pytest/",
    "/unittest/",
    "/xdist/",
    "/execnet/",
)


_library_files = {}


def _is_library(file):
    known = _library_files.get(file)
    if known is None:
        known = file.startswith("<") or file.endswith("/pytest") or os.path.basename(os.path.dirname(file)) == "cupool"
        known = _library_files[file] = known or any(part in file for part in _LIBRARY)
    return known


def trim(frames, depth, beyond=()):
    """``frames`` (a list of ``(function, file, line)``, innermost first,
    then those of the iterable ``beyond``, read no further than needed) cut
    to ``depth`` as a tuple. A stack deeper than that through libraries (a
    compiled model's call passes some thirty frames of PyTorch's before the
    tensor is made) keeps its innermost ``depth - 1`` frames and, last, the
    first frame of the program's own beyond them: the line a finding names."""
    if depth <= 0:
        return ()
    if len(frames) < depth:
        return tuple(frames)
    head, last = tuple(frames[: depth - 1]), frames[depth - 1]
    if _is_library(last[1]) and all(_is_library(f[1]) for f in head):
        rest = itertools.chain(frames[depth:], beyond)
        last = next((f for f in rest if not _is_library(f[1])), last)
    return head + (last,)


class Stacks(object):
    """Each distinct stack once, as the records write them: ``listed[i]`` is
    stack ``i``'s ``[function, file, line]`` frames, innermost first."""

    def __init__(self):
        self.listed, self._at, self._lock = [], {}, threading.Lock()

    def id_of(self, key):
        """The position of stack ``key`` (a tuple of frames), given one if new."""
        at = self._at.get(key)
        if at is None:
            listed = [list(f) for f in key]
            # Only dictionary and list operations under the lock: nothing there
            # makes Python objects that could run a finalizer or a handler
            # (one that allocates, and records, in this very thread).
            with self._lock:
                at = self._at.get(key)
                if at is None:
                    self.listed.append(listed)
                    at = self._at[key] = len(self.listed) - 1
        return at


def write(log_dir, pid, doc, stem):
    """Writes ``doc`` as ``<log_dir>/<stem>.<pid>.json`` (``.<n>.json`` when
    that name is taken): to a temporary file first, then linked into place,
    so a reader never sees half a file. Returns the path."""
    import json

    doc = dict(doc)
    doc["complete"] = True
    text = json.dumps(doc, separators=(",", ":"))
    os.makedirs(log_dir, exist_ok=True)
    tmp = os.path.join(log_dir, ".%s.%d.json.tmp" % (stem, pid))
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.write("\n")
    try:
        for n in range(1000):
            name = "%s.%d.json" % (stem, pid) if n == 0 else "%s.%d.%d.json" % (stem, pid, n)
            path = os.path.join(log_dir, name)
            try:
                os.link(tmp, path)
                return path
            except FileExistsError:
                continue
            except OSError:
                # No hard links here: a rename, unless the name is taken.
                if os.path.exists(path):
                    continue
                os.replace(tmp, path)
                return path
        raise OSError("no free name for %s.%d.json in %s" % (stem, pid, log_dir))
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)

"""cupool check's sitecustomize (carried in the cupool binary, see
cli/src/check/python.rs): put first on PYTHONPATH for the checked program,
so that every Python process of the run loads it at startup.

It does two things, and nothing else:

1. When the program imports ``torch`` (or ``jax``, ``cupy``), it hands the
   module to ``cupool.torch_history`` (``cupool.jax_history``,
   ``cupool.cupy_history``) right after its ``__init__`` has run, which has
   PyTorch record its tensor allocations once CUDA starts (JAX's live arrays
   sampled once it has a backend, CuPy's allocations recorded by its
   allocator), so that growth inside their caches is judged by tensor or
   array (docs/check.md). Until then it costs one finder on ``sys.meta_path``
   that answers no other import.
2. It runs the ``sitecustomize`` it shadows, if there is one further along
   ``sys.path`` (a distribution's, a virtualenv's, the user's), exactly as
   Python would have: an exception there is reported by Python as before.

Its own failures are swallowed: it never prints, and never changes what
the program imports, computes or returns.
"""

import sys


# The modules watched, and the recorder each is handed to once imported.
_CUPOOL_WATCHED = {
    "torch": ("torch_history", "torch_imported"),
    "jax": ("jax_history", "jax_imported"),
    "cupy": ("cupy_history", "cupy_imported"),
}


def _cupool_hook(watched):
    if not watched:
        return

    class CupoolImportHook(object):
        """Finds nothing itself. On the import of a watched module it asks
        the finders after it, and makes the loader they give call cupool
        once the module's ``__init__`` has run."""

        busy = False

        def find_spec(self, name, path=None, target=None):
            if name not in watched or self.busy:
                return None
            self.busy = True
            try:
                spec = None
                for finder in list(sys.meta_path):
                    if finder is self:
                        continue
                    find = getattr(finder, "find_spec", None)
                    if find is None:
                        continue
                    spec = find(name, path, target)
                    if spec is not None:
                        break
                if spec is None:
                    return None  # not importable (now): stay, in case sys.path changes
                del watched[name]
                if not watched:
                    _unhook(self)
                _wrap(spec, name)
                return spec
            except Exception:
                return None  # the import goes on as if this finder were not there
            finally:
                self.busy = False

    def _unhook(hook):
        try:
            sys.meta_path.remove(hook)
        except ValueError:
            pass

    def _wrap(spec, watched_name):
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return

        def exec_and_tell(module):
            try:
                exec_module(module)
            finally:
                # This loader object may serve other modules too: only this import is watched.
                try:
                    del loader.exec_module
                except Exception:
                    pass
            if getattr(module, "__name__", None) == watched_name:
                try:
                    import importlib

                    recorder, call = _CUPOOL_WATCHED[watched_name]
                    getattr(importlib.import_module("cupool." + recorder), call)(module)
                except Exception:
                    pass

        try:
            loader.exec_module = exec_and_tell
        except Exception:
            pass

    sys.meta_path.insert(0, CupoolImportHook())


def _cupool_shadowed():
    """The spec of the sitecustomize this one hides, or None."""
    import os

    here = os.path.dirname(os.path.realpath(__file__))

    def other(entry):
        try:
            return os.path.realpath(entry or os.getcwd()) != here
        except Exception:
            return True

    paths = [p for p in sys.path if isinstance(p, str) and other(p)]
    for finder in sys.meta_path:
        if getattr(finder, "__name__", None) == "PathFinder":
            return finder.find_spec("sitecustomize", paths)
    return None


try:
    _cupool_hook({m: r for m, r in _CUPOOL_WATCHED.items() if m not in sys.modules})
except Exception:
    pass

try:
    _cupool_spec = _cupool_shadowed()
except Exception:
    _cupool_spec = None
if _cupool_spec is not None and _cupool_spec.loader is not None:
    import importlib.util as _cupool_util

    _cupool_module = _cupool_util.module_from_spec(_cupool_spec)
    # Errors here are the shadowed sitecustomize's own: they reach Python's
    # site module, which reports them as it would have without cupool.
    _cupool_spec.loader.exec_module(_cupool_module)

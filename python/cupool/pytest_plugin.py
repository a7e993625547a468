"""pytest plugin of cupool: per-test leak checks under ``cupool check``.

``cupool check`` loads it into every pytest run it starts (``PYTEST_PLUGINS``).
A placeholder: it registers nothing yet.
"""

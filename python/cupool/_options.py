"""``CUPOOL_OPTIONS``, read as the shim reads it (core/src/options.rs ``entries``).

Shared by the pytest plugin and the PyTorch, JAX and CuPy history recorders; imports
nothing, so that reading the options costs nothing where they are read.
"""

# The defaults of the options the package reads, as core/src/options.rs
# declares them (tests/docs.rs checks that they agree).
DEFAULTS = {
    "log": "1",
    "log_dir": ".",
    "python_depth": "16",
    "run_id": "",
    "jax_history_ms": "100",
    "jax_history": "200000",
    "cupy_history": "200000",
    "torch_history": "200000",
    "verbosity": "1",
}


def option(opts, key):
    """Option ``key`` from ``opts`` (what `parse_options` returned), else its default."""
    return opts.get(key, DEFAULTS[key])


def integer(value, default):
    """``value`` (an option's text) as an integer, or ``default`` when it is none."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def parse_options(spec):
    """``key=value:key=value`` into a dict; the last entry of a key wins.

    A value runs to the next ``:`` (blanks around it dropped) unless quoted:
    ``'...'`` as it is, ``"..."`` with ``\\"`` and ``\\\\``. Entries the shim
    would reject are skipped, as the shim skips them.
    """
    out = {}
    rest = spec
    while True:
        rest = rest.lstrip(":" + _BLANKS)
        if not rest:
            break
        stop = min([i for i in (rest.find(":"), rest.find("=")) if i >= 0] or [len(rest)])
        if rest[stop : stop + 1] != "=":
            rest = rest[stop:]
            continue
        key = rest[:stop].strip()
        after = rest[stop + 1 :].lstrip()
        if after[:1] in ("'", '"'):
            quoted = _unquote(after, after[0])
            if quoted is None:
                break
            value, tail = quoted
        else:
            end = after.find(":")
            end = len(after) if end < 0 else end
            value, tail = after[:end].strip(), after[end:]
        tail = tail.lstrip()
        if tail and not tail.startswith(":"):
            end = tail.find(":")
            rest = tail[len(tail) if end < 0 else end :]
            continue
        out[key] = value
        rest = tail
    return out


_BLANKS = " \t\n\r\x0b\x0c"


def _unquote(s, q):
    value = []
    i = 1
    while i < len(s):
        c = s[i]
        if c == q:
            return "".join(value), s[i + 1 :]
        if c == "\\" and q == '"':
            i += 1
            if i >= len(s):
                return None
            c = s[i]
        value.append(c)
        i += 1
    return None


def flag(value, default):
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    return default

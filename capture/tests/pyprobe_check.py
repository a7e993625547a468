"""Checks cupool_capture::python against the interpreter running this script.

    python3 capture/tests/pyprobe_check.py path/to/libpyprobe.so

Builds on capture/examples/pyprobe.rs (cargo build --release -p cupool-capture
--example pyprobe). Prints one PASS or FAIL line per check and exits non-zero
if any failed. Every expected answer comes from Python itself (frame objects,
co_lines()), taken for the same stack the probe read.

On a version the probe does not support, the checks are that it says so and
captures nothing.
"""

import asyncio
import ctypes
import inspect
import sys
import threading

HAS_QUALNAME = sys.version_info >= (3, 11)
SUPPORTED = (3, 10) <= sys.version_info[:2] <= (3, 13)
BUF = 1 << 20

failures = []


def report(name, ok, detail=""):
    print(("PASS " if ok else "FAIL ") + name + (": " + detail if detail and not ok else ""))
    if not ok:
        failures.append(name)


def load(path, kind):
    lib = kind(path)
    for f in ("pyprobe_stack", "pyprobe_stack_new_thread", "pyprobe_describe_code"):
        getattr(lib, f).restype = ctypes.c_int64
    lib.pyprobe_stack.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t]
    lib.pyprobe_stack_new_thread.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t]
    lib.pyprobe_describe_code.argtypes = [ctypes.c_uint64, ctypes.c_uint32, ctypes.c_char_p, ctypes.c_size_t]
    lib.pyprobe_bench.restype = ctypes.c_double
    lib.pyprobe_bench.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int64)]
    return lib


def name_of(code):
    return code.co_qualname if HAS_QUALNAME else code.co_name


def parse(buf, n):
    """The probe's frames as (file, function, line) tuples."""
    if n < 0:
        raise RuntimeError("probe buffer too small")
    if n == 0:
        return []
    records = buf.value.decode("utf-8").split("\x1e")
    out = []
    for r in records:
        file, function, line = r.split("\x1f")
        out.append((file, function, int(line)))
    if len(out) != n:
        raise RuntimeError("probe wrote %d frames, said %d" % (len(out), n))
    return out


def python_view(frame, innermost_line):
    """What Python says about the stack from `frame` outwards, the innermost
    frame standing at `innermost_line`."""
    out = [(frame.f_code.co_filename, name_of(frame.f_code), innermost_line)]
    f = frame.f_back
    while f is not None:
        out.append((f.f_code.co_filename, name_of(f.f_code), f.f_lineno))
        f = f.f_back
    return out


def snapshot(lib, max_frames=64):
    """(probe's stack, Python's own view of the same stack)."""
    buf = ctypes.create_string_buffer(BUF)
    line = sys._getframe().f_lineno + 1
    n = lib.pyprobe_stack(buf, BUF, max_frames)
    return parse(buf, n), python_view(sys._getframe(), line)[:max_frames]


def same_stack(name, got_expected):
    got, expected = got_expected
    ok = got == expected and len(got) > 0
    detail = "" if ok else "\n  probe:  %r\n  python: %r" % (got, expected)
    report(name, ok, detail)
    return got


# --- call shapes -------------------------------------------------------------


def level_c(lib):
    return snapshot(lib)


def level_b(lib):
    return level_c(lib)


def level_a(lib):
    return level_b(lib)


class Holder:
    def method(self, lib):
        return snapshot(lib)

    @staticmethod
    def static(lib):
        return snapshot(lib)


def generator(lib):
    yield snapshot(lib)


async def coroutine(lib):
    await asyncio.sleep(0)
    return snapshot(lib)


def recurse(lib, depth, max_frames):
    if depth == 0:
        return snapshot(lib, max_frames)
    return recurse(lib, depth - 1, max_frames)


# Names in every width CPython stores str in: Latin-1, UCS-2 and UCS-4 (a
# CJK Extension B letter, which NFKC leaves alone).
UNICODE_SRC = """
def café(lib, snap):
    return 函数(lib, snap)

def 函数(lib, snap):
    return \U00020000名(lib, snap)

def \U00020000名(lib, snap):
    return snap(lib)
"""


def unicode_names(lib, filename):
    ns = {}
    exec(compile(UNICODE_SRC, filename, "exec"), ns)
    return ns["café"](lib, snapshot)


def line_far_away(lib):
    # Places the call 5000 lines below the def: a multi-byte line delta.
    src = "def far(lib, snap):\n" + "\n" * 5000 + "    return snap(lib)\n"
    ns = {}
    exec(compile(src, "<far>", "exec"), ns)
    return ns["far"](lib, snapshot)


# --- checks ------------------------------------------------------------------


def check_supported(cdll, pydll):
    status = ctypes.create_string_buffer(256)
    cdll.pyprobe_status(status, 256)
    want = "Python %d.%d supported" % sys.version_info[:2]
    report("status says '%s'" % want, status.value.decode() == want, status.value.decode())

    # The innermost frame, by hand: file, function and the call's line.
    buf = ctypes.create_string_buffer(BUF)
    line = inspect.currentframe().f_lineno + 1
    n = cdll.pyprobe_stack(buf, BUF, 8)
    got = parse(buf, n)
    want = (__file__, "check_supported", line)
    report("innermost frame is this file, function and line", got[:1] == [want], "%r != %r" % (got[:1], want))
    report("next frame is the caller", len(got) > 1 and got[1][1] == "main", repr(got[:2]))

    got = same_stack("nested functions, innermost first", level_a(cdll))
    report(
        "nested functions in order",
        [f[1] for f in got[:4]] == ["snapshot", "level_c", "level_b", "level_a"],
        repr([f[1] for f in got[:4]]),
    )
    same_stack("method", Holder().method(cdll))
    same_stack("static method", Holder.static(cdll))
    same_stack("generator frame", next(generator(cdll)))
    same_stack("coroutine frame (asyncio)", asyncio.run(coroutine(cdll)))
    same_stack("Python called back from C (map)", list(map(lambda _: snapshot(cdll), [0]))[0])
    same_stack("Python called back from C (sorted key)", key_from_c(cdll))
    same_stack("lambda and exec'd code", eval("(lambda: snapshot(cdll))()", {"snapshot": snapshot, "cdll": cdll}))
    same_stack("a call 5000 lines below its def", line_far_away(cdll))
    same_stack("non-ASCII names and file", unicode_names(cdll, "/tmp/ünïcode/файл\U0001F40D.py"))

    long_name = "/tmp/" + "d" * 5000 + ".py"
    got, expected = unicode_names(cdll, long_name)
    cut = long_name[:4096] + "\u2026"
    expected = [(cut if f == long_name else f, fn, line) for f, fn, line in expected]
    report(
        "a 5000-character file name is cut to 4096 characters and an ellipsis",
        got == expected and got[1][0] == cut,
        "%r" % [(f[-12:], fn, line) for f, fn, line in got[:4]],
    )

    got, expected = recurse(cdll, 300, 64)
    report("64 of 300 recursive frames", got == expected and len(got) == 64, "%r" % got[:3])
    got, expected = recurse(cdll, 10, 1)
    report("one frame when one is asked for", got == expected and len(got) == 1, repr(got))

    result = {}

    def in_thread():
        result["stack"] = level_a(cdll)

    t = threading.Thread(target=in_thread)
    t.start()
    t.join()
    got = same_stack("threading.Thread", result["stack"])
    report("threading.Thread's stack ends in threading.py", any("threading" in f[0] for f in got), repr(got[-1:]))

    buf = ctypes.create_string_buffer(BUF)
    n = cdll.pyprobe_stack_new_thread(buf, BUF, 64)
    report("a native thread that never ran Python gets 0 frames", n == 0, "got %d" % n)

    # The GIL held (PyDLL) and released (CDLL): the same answer for one line.
    b1 = ctypes.create_string_buffer(BUF)
    b2 = ctypes.create_string_buffer(BUF)
    n1, n2 = cdll.pyprobe_stack(b1, BUF, 64), pydll.pyprobe_stack(b2, BUF, 64)
    report("GIL held (PyDLL) gives what GIL released (CDLL) gives", n1 > 0 and (n1, b1.value) == (n2, b2.value),
           "%r / %r" % (parse(b1, n1)[:2], parse(b2, n2)[:2]))
    same_stack("GIL held (PyDLL), against Python", level_a(pydll))

    check_describe_every_instruction(cdll)

    frames = ctypes.c_int64()
    ns10 = deep_bench(cdll, 10, frames)
    print("INFO capture: %.1f ns per call for %d frames" % (ns10, frames.value))
    ns1 = cdll.pyprobe_bench(1000000, 1, ctypes.byref(frames))
    print("INFO capture: %.1f ns per call for %d frame (out.len() == 1)" % (ns1, frames.value))


def key_from_c(lib):
    # sorted() calls the key function from C.
    out = []
    sorted([0], key=lambda _: out.append(snapshot(lib)))
    return out[0]


def deep_bench(lib, depth, frames):
    if depth > 0:
        return deep_bench(lib, depth - 1, frames)
    return lib.pyprobe_bench(200000, 64, ctypes.byref(frames))


def code_objects(module):
    todo = [v.__code__ for v in vars(module).values() if inspect.isfunction(v)]
    for cls in (v for v in vars(module).values() if inspect.isclass(v)):
        todo += [v.__code__ for v in vars(cls).values() if inspect.isfunction(v)]
    seen = set()
    while todo:
        co = todo.pop()
        if id(co) in seen:
            continue
        seen.add(id(co))
        yield co
        todo += [c for c in co.co_consts if inspect.iscode(c)]


def check_describe_every_instruction(lib):
    """describe() on every instruction of many code objects, against
    co_lines() (the line CPython gives that offset) and the names."""
    import ast
    import json.decoder
    import threading as th

    buf = ctypes.create_string_buffer(BUF)
    modules = [sys.modules[__name__], ast, json.decoder, th, inspect, asyncio.base_events]
    checked = 0
    bad = []
    for module in modules:
        for co in code_objects(module):
            ranges = list(co.co_lines())
            for offset in range(0, len(co.co_code), 2):
                want_line = 0
                for start, end, line in ranges:
                    if start <= offset < end:
                        want_line = line or 0
                        break
                n = lib.pyprobe_describe_code(id(co), offset, buf, BUF)
                got = tuple(buf.value.decode().split("\x1f")) if n == 1 else None
                want = (co.co_filename, name_of(co), str(want_line))
                checked += 1
                if got != want and len(bad) < 5:
                    bad.append("%s+%d: %r != %r" % (co.co_name, offset, got, want))
    report("describe() on %d instructions matches co_lines() and the names" % checked, not bad and checked > 10000,
           "\n  ".join(bad))


def check_unsupported(cdll):
    status = ctypes.create_string_buffer(256)
    cdll.pyprobe_status(status, 256)
    text = status.value.decode()
    report("status says not supported", "not supported" in text, text)
    print("INFO status: " + text)
    buf = ctypes.create_string_buffer(BUF)
    n = cdll.pyprobe_stack(buf, BUF, 64)
    report("no frames on an unsupported version", n == 0, "got %d" % n)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    path = sys.argv[1]
    print("INFO Python %s at %s" % (sys.version.split()[0], sys.executable))
    cdll = load(path, ctypes.CDLL)
    pydll = load(path, ctypes.PyDLL)
    if SUPPORTED:
        check_supported(cdll, pydll)
    else:
        check_unsupported(cdll)
    if failures:
        print("%d FAILED: %s" % (len(failures), ", ".join(failures)))
        sys.exit(1)
    print("ALL PASSED")


if __name__ == "__main__":
    main()

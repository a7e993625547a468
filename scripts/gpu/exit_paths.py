"""A CuPy program (its pool off: every array is a cudaMalloc of its own)
that runs commands through `subprocess` at every step, some of them missing
(vfork children that exec, or _exit when that fails), then leaves by
EXIT_BY: `exec` (os.execv of /bin/true), `_exit` (os._exit) or, unset, by
returning. With LEAK=1 it keeps one allocation to the end, made through
the driver (ctypes): an exit leak at the line marked ALLOCATED. (An array
CuPy still holds at exit is memory of a known cache to the check, kept by
the interpreter's end, not a leak: the default suppressions' cupy_backends/.)
For scripts/gpu-leakcheck.sh."""
import ctypes
import os
import subprocess

import cupy

driver = ctypes.CDLL("libcuda.so.1")

cupy.cuda.set_allocator(None)
kept = []
for step in range(20):
    a = cupy.ones(1 << 18)
    if os.environ.get("LEAK") and step == 0:
        kept.append(ctypes.c_uint64())
        assert driver.cuMemAlloc_v2(ctypes.byref(kept[-1]), ctypes.c_size_t(1 << 20)) == 0  # ALLOCATED
    try:
        subprocess.run(["/nonexistent-command"])
    except FileNotFoundError:
        pass
    subprocess.run(["true"], check=True)
    del a
cupy.cuda.Device().synchronize()
how = os.environ.get("EXIT_BY", "")
if how == "exec":
    os.execv("/bin/true", ["true"])
if how == "_exit":
    os._exit(0)

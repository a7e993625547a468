"""Memory given back stays given back: process A allocates most of the free
GPU memory in 1 GiB pieces, frees it and empties its cache, then starts
process B (under cupool too when A is, and once more with cupool taken out
of its environment), which allocates as much. Without cupool B succeeds.

  python3 give_back.py torch|cupy        (A)
  python3 give_back.py B torch|cupy N    (B: N GiB, exit 0 when it got them)
"""
import os
import subprocess
import sys

GIB = 1 << 30


def allocate(lib, n):
    if lib == "torch":
        import torch
        return [torch.empty(GIB, dtype=torch.uint8, device="cuda") for _ in range(n)]
    import cupy
    return [cupy.empty(GIB, dtype=cupy.uint8) for _ in range(n)]


def empty_cache(lib):
    if lib == "torch":
        import torch
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    else:
        import cupy
        cupy.cuda.Device().synchronize()
        cupy.get_default_memory_pool().free_all_blocks()


def free_gib(lib):
    if lib == "torch":
        import torch
        return torch.cuda.mem_get_info()[0] // GIB
    import cupy
    return cupy.cuda.runtime.memGetInfo()[0] // GIB


def main():
    if sys.argv[1] == "B":
        lib, n = sys.argv[2], int(sys.argv[3])
        try:
            allocate(lib, n)
        except Exception as e:  # out of memory
            print(f"B: {type(e).__name__}", file=sys.stderr)
            sys.exit(1)
        sys.exit(0)
    lib = sys.argv[1]
    n = int(free_gib(lib) * 0.85)
    held = allocate(lib, n)
    del held
    empty_cache(lib)
    b = [sys.executable, __file__, "B", lib, str(n)]
    under = subprocess.run(b).returncode == 0
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "CUPOOL_OPTIONS")}
    plain = subprocess.run(b, env=env).returncode == 0
    print(f"result: {lib} A_allocated_gib={n} B_got_it={int(under)} B_without_cupool_got_it={int(plain)}")


main()

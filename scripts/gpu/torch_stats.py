# cupool's C API from Python, the way the cupool module reads it: under cupool
# the figures follow PyTorch's own (every PyTorch segment is one cudaMalloc),
# and reserved is at least allocated. Prints one `result:` line.
import ctypes, torch

class Stats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "allocated", "peak_allocated", "reserved", "peak_reserved",
        "allocations", "peak_allocations", "num_allocs", "num_frees", "num_alloc_failures")]

lib = ctypes.CDLL(None)
read = lib.cupool_memory_stats
def stats():
    s = Stats()
    assert read(0, ctypes.byref(s), ctypes.sizeof(s)) == 0
    return s
x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
s = stats()
torch_reserved = torch.cuda.memory_reserved()
ok = s.allocated >= torch_reserved and s.reserved >= s.allocated and s.peak_allocated >= s.allocated
del x
torch.cuda.empty_cache()
after = stats()
ok = ok and after.allocated < s.allocated
print(f"result: ok={int(ok)} cupool_allocated={s.allocated} torch_reserved={torch_reserved} "
      f"cupool_reserved={s.reserved} after_empty_cache={after.allocated}")

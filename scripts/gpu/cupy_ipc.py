"""CuPy's IPC API between two processes (multiprocessing, spawn): the producer
allocates buffers of several sizes with cupy.cuda.runtime.malloc (each a
cudaMalloc, so each its own allocation as CUDA names them), fills them, and
sends cupy.cuda.runtime.ipcGetMemHandle of each through a pipe; the consumer
opens each with ipcOpenMemHandle, reads it back, and closes it. The producer
then frees its buffers while the consumer still holds a second open of the
first one. Measured on an H200 (driver 580): plainly, CUDA hands the freed
memory to the producer's next cudaMalloc while the consumer still has it
open, so the consumer reads the new values (kept_after_free=0); cupool never
hands an exported block out again (kept_after_free=1). Reported, not judged.

RECEIVER=plain starts the consumer without LD_PRELOAD (outside cupool): it
may be refused an open (a CUDA error), never given other memory.
Prints one `result:` line: ok=1 when every open either matched or (plain
receiver only) failed with a CUDA error."""
import multiprocessing as mp
import os
import sys

import cupy

SIZES = [512, 4096, 1 << 20, (1 << 20) + 512, 3 << 20, 64 << 20]


def fill(ptr, n, seed):
    mem = cupy.cuda.UnownedMemory(ptr, n, None)
    a = cupy.ndarray((n // 4,), dtype=cupy.uint32, memptr=cupy.cuda.MemoryPointer(mem, 0))
    a[:] = cupy.arange(n // 4, dtype=cupy.uint32) * 7 + seed
    return a


def view(ptr, n):
    mem = cupy.cuda.UnownedMemory(ptr, n, None)
    return cupy.ndarray((n // 4,), dtype=cupy.uint32, memptr=cupy.cuda.MemoryPointer(mem, 0))


def digest(a):
    return (int(a[0]), int(a[-1]), int(a.astype(cupy.uint64).sum()))


def consumer(conn):
    handles = conn.recv()
    out, kept = [], None
    for i, h in enumerate(handles):
        try:
            p = cupy.cuda.runtime.ipcOpenMemHandle(h)
        except cupy.cuda.runtime.CUDARuntimeError as e:
            out.append(("error", str(e).split(":")[0]))
            continue
        out.append(("open", digest(view(p, SIZES[i]))))
        if i == 0:
            kept = p
        else:
            cupy.cuda.runtime.ipcCloseMemHandle(p)
    conn.send(out)
    conn.recv()  # the producer freed its buffers
    after = digest(view(kept, SIZES[0])) if kept is not None else None
    if kept is not None:
        cupy.cuda.runtime.ipcCloseMemHandle(kept)
    conn.send(after)


if __name__ == "__main__":
    mp.set_start_method("spawn")
    ptrs = [cupy.cuda.runtime.malloc(n) for n in SIZES]
    want = [digest(fill(p, n, i + 1)) for i, (p, n) in enumerate(zip(ptrs, SIZES))]
    cupy.cuda.runtime.deviceSynchronize()
    handles = [cupy.cuda.runtime.ipcGetMemHandle(p) for p in ptrs]
    plain = os.environ.get("RECEIVER") == "plain"
    saved = os.environ.pop("LD_PRELOAD", None) if plain else None
    parent, child = mp.Pipe()
    proc = mp.Process(target=consumer, args=(child,))
    proc.start()
    if saved is not None:
        os.environ["LD_PRELOAD"] = saved
    parent.send(handles)
    got = parent.recv()
    for p in ptrs:
        cupy.cuda.runtime.free(p)
    # Memory the pool would hand out next: it must not land on the kept block.
    again = [cupy.cuda.runtime.malloc(n) for n in SIZES]
    for i, (p, n) in enumerate(zip(again, SIZES)):
        fill(p, n, 100 + i)
    cupy.cuda.runtime.deviceSynchronize()
    parent.send("freed")
    after = parent.recv()
    proc.join(60)
    wrong = [i for i, g in enumerate(got) if g[0] == "open" and g[1] != want[i]]
    refused = [i for i, g in enumerate(got) if g[0] == "error"]
    kept_ok = after is None or after == want[0]
    ok = not wrong and proc.exitcode == 0 and (plain or not refused)
    print(
        f"result: ok={int(ok)} receiver={'plain' if plain else 'same'} opened={len(got) - len(refused)}/{len(got)} "
        f"wrong={wrong} refused={refused} kept_after_free={int(kept_ok)} exit={proc.exitcode}"
    )
    sys.exit(0 if ok else 1)

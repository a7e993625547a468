"""PyTorch shares CUDA tensors with another process (torch.multiprocessing,
spawn): the consumer must see the producer's values. Several small tensors
share one PyTorch segment, and under cupool's pool PyTorch's segments are
blocks inside pool segments, so their IPC handles name blocks inside a
segment. (PyTorch shares CUDA tensors only with its caching allocator on.)
Prints one `result:` line."""
import os, sys, torch, torch.multiprocessing as mp

SIZES = [10, 600, 1200, 5000, 70_000, 3_000_000]

def consumer(q, r, done):
    ts = q.get()
    r.put([(t[:3].tolist(), t.double().sum().item()) for t in ts])
    done.wait()

if __name__ == "__main__":
    mp.set_start_method("spawn")
    ts = [torch.arange(n, device="cuda", dtype=torch.float32) * (i + 1) for i, n in enumerate(SIZES)]
    torch.cuda.synchronize()
    want = [(t[:3].tolist(), t.double().sum().item()) for t in ts]
    q, r, done = mp.Queue(), mp.Queue(), mp.Event()
    p = mp.Process(target=consumer, args=(q, r, done))
    p.start()
    q.put(ts)
    got = r.get(timeout=40)
    done.set()
    p.join(60)
    ok = got == want and p.exitcode == 0
    cache = "off" if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1" else "on"
    print(f"result: ok={int(ok)} cache={cache} firsts={[g[0] for g in got]} exit={p.exitcode}")
    sys.exit(0 if ok else 1)

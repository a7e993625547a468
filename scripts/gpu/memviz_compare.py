"""cupool's memory_viz export of a PyTorch run against PyTorch's own snapshot.

  python3 memviz_compare.py run OUT_DIR          # the workload; writes torch.pickle, torch.json
  python3 memviz_compare.py compare OUT_DIR CUPOOL.pickle

With PyTorch's caching allocator on, every cudaMalloc PyTorch makes is one
of its segments, so cupool's live blocks at the end must be PyTorch's
segments at the end (same addresses, same sizes) and the peak of cupool's
device trace must be torch.cuda.max_memory_reserved(). The workload uses
element-wise work only, so no library (cuBLAS) allocates beside PyTorch.
The compare step also hands cupool's pickle to PyTorch's own memory_viz
code (segment_plot, trace_plot), which must accept it.
"""
import json
import os
import pickle
import sys


def run(out):
    import torch

    torch.cuda.memory._record_memory_history(max_entries=100000)
    dev = torch.device("cuda")
    keep = []
    # Sizes across PyTorch's small (2 MiB) and large segments, some freed.
    for i in range(60):
        n = (1 + (i * 7919) % 97) * 4096 * (1 + (i % 5) ** 3)
        t = torch.full((n,), float(i), device=dev)
        t = t * 2 + 1
        if i % 3 == 0:
            keep.append(t)
        if i == 30:
            big = torch.empty(300 << 20, dtype=torch.uint8, device=dev)
            big.fill_(1)
            del big
            torch.cuda.empty_cache()
    torch.cuda.synchronize()
    checksum = float(sum(t.sum().item() for t in keep))
    snap = torch.cuda.memory._snapshot()
    with open(os.path.join(out, "torch.pickle"), "wb") as f:
        pickle.dump(snap, f)
    with open(os.path.join(out, "torch.json"), "w") as f:
        json.dump({"max_reserved": torch.cuda.max_memory_reserved(), "reserved": torch.cuda.memory_reserved(),
                   "checksum": checksum}, f)
    print(f"checksum {checksum}")


def cupool_live_and_peak(snap):
    live = {}
    for seg in snap["segments"]:
        if seg["device"] != 0:
            continue
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                live[b["address"]] = b["requested_size"]
    cur = peak = 0
    for e in snap["device_traces"][0]:
        if e["action"] == "alloc":
            cur += e["size"]
        elif e["action"] == "free_completed":
            cur -= e["size"]
        peak = max(peak, cur)
    return live, peak


def compare(out, cupool_pickle):
    with open(os.path.join(out, "torch.pickle"), "rb") as f:
        torch_snap = pickle.load(f)
    with open(os.path.join(out, "torch.json")) as f:
        facts = json.load(f)
    with open(cupool_pickle, "rb") as f:
        ours = pickle.load(f)
    torch_segments = {s["address"]: s["total_size"] for s in torch_snap["segments"] if s["device"] == 0}
    live, peak = cupool_live_and_peak(ours)
    missing = {a: s for a, s in torch_segments.items() if live.get(a) != s}
    extra = {a: s for a, s in live.items() if a not in torch_segments}
    print(f"torch: {len(torch_segments)} segments, {sum(torch_segments.values())} bytes reserved at the end, "
          f"max_memory_reserved {facts['max_reserved']}")
    print(f"cupool: {len(live)} live blocks, {sum(live.values())} bytes at the end, peak {peak}; "
          f"settings {ours.get('allocator_settings')}, {ours.get('cupool')}")
    if missing:
        print(f"  PyTorch segments not live in cupool's export at their address and size: {sorted(missing.items())[:5]}")
    if extra:
        print(f"  live in cupool's export but no PyTorch segment: {sorted(extra.items())[:5]}")
    from torch.cuda import _memory_viz as mv
    accepted = []
    for name in ("segment_plot", "trace_plot"):
        try:
            html = getattr(mv, name)(ours)
            accepted.append(f"{name} {len(html)} chars")
        except Exception as e:  # noqa: BLE001 - the point is to report any failure
            accepted.append(f"{name} FAILED: {type(e).__name__}: {e}")
    print("PyTorch's _memory_viz on cupool's pickle: " + "; ".join(accepted))
    ok = (not missing and not extra and len(live) == len(torch_segments) and peak == facts["max_reserved"]
          and all("FAILED" not in a for a in accepted))
    print(f"memviz-compare: {'PASS' if ok else 'FAIL'} (live blocks {len(live)} vs segments {len(torch_segments)}, "
          f"peak {peak} vs max_memory_reserved {facts['max_reserved']})")
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(sys.argv[2])
    else:
        sys.exit(compare(sys.argv[2], sys.argv[3]))

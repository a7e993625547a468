"""Shrinks a recorded cupool log into a bundled replay trace: keeps the header,
the end record and the first LIMIT allocation events (alloc, free, map, unmap),
each with its stack id, the allocation site a placement by expected lifetime
would go by; drops phases, stack definitions (the frames: the ids alone tell
sites apart) and threads.

usage: python3 scripts/trim-trace.py IN.json.gz OUT.json.gz [LIMIT]"""
import gzip
import json
import sys

src, dst = sys.argv[1], sys.argv[2]
limit = int(sys.argv[3]) if len(sys.argv) > 3 else None
log = json.load(gzip.open(src))
events = [
    {k: v for k, v in e.items() if k != "tid"}
    for e in log["events"]
    if e.get("ev") in ("start", "alloc", "free", "map", "unmap")
]
log["events"] = events[:limit] if limit else events
with gzip.open(dst, "wb", compresslevel=9) as f:
    f.write(json.dumps(log, separators=(",", ":")).encode())
print(f"{dst}: {len(log['events'])} of {len(events)} events")

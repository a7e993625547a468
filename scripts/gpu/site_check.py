"""Checks that the top allocation site by peak bytes of `cupool report --json`
names the line marked PLANTED of SOURCE. Prints one row for gpu-sites.sh.

usage: site_check.py NAME REPORT.json SOURCE
"""
import json
import sys

name, report, source = sys.argv[1:4]
line = next(i + 1 for i, l in enumerate(open(source)) if l.rstrip().endswith("PLANTED"))
base = source.rsplit("/", 1)[-1]
try:
    logs = json.load(open(report))
    sites = [s for log in logs for s in log["sites"]["by_peak"]]
    top = max(sites, key=lambda s: s["peak_bytes"])
    frames = top["frames"]
    hit = [f for f in frames if (f.get("file") or "").endswith(base) and f.get("line") == line]
    shown = "; ".join(f"{f.get('function')} {(f.get('file') or '').rsplit('/', 1)[-1]}:{f.get('line')} [{f['lang']}]" for f in frames[:4])
    verdict = "PASS" if hit else "FAIL"
    print(f"{name:<24} | {verdict} | top site {top['peak_bytes'] >> 20} MiB: #{frames.index(hit[0]) if hit else '-'} is {base}:{line}; frames: {shown}")
except Exception as e:  # a row, not a traceback, in the table
    print(f"{name:<24} | FAIL | {type(e).__name__}: {e}")

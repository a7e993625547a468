"""One row of scripts/gpu-leakcheck.sh from `cupool check --json` output.

usage: check_verdict.py NAME RC FINDINGS.json EXPECT
EXPECT: clean | note:TEXT (clean, with a note holding TEXT) | growth:FILE:LINE[:ranks] | exit:FILE:LINE | test:NAME[:FILE:LINE] | sanitizer:OUTPUT | budget:WHAT | status:N
"""
import json
import re
import sys

name, rc, path, expect = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]


def row(ok, text):
    print(f"{name:<26} | {'PASS' if ok else 'FAIL'} | rc={rc} {text}")


try:
    doc = json.load(open(path))
except Exception as e:
    row(False, f"no findings file: {e}")
    sys.exit()
failing = [f for f in doc["findings"] if "suppressed_by" not in f]
held = sum(f["bytes"] for f in doc["findings"] if "suppressed_by" in f)
desc = "; ".join(
    f"{f['kind']} {f['bytes']}B x{f['count']}"
    + (f" test={f['test']}" if "test" in f else "")
    + (f" {f['growth']['bytes_per_phase']}B/phase x{f['growth']['phases']} ({f['growth']['phases_from']})" if "growth" in f else "")
    + (" at " + ",".join(f"{(fr.get('file') or '?').rsplit('/', 1)[-1]}:{fr.get('line')}" for fr in f["frames"][:3]) if f["frames"] else "")
    + " ranks=" + ",".join(str(p.get("rank")) for p in f["processes"])
    for f in failing[:4]
)
if expect == "clean":
    row(rc == 0 and not failing, f"failing={len(failing)} suppressed_bytes={held} {desc}")
elif expect.startswith("note:"):
    notes = [n for n in doc.get("notes", []) if expect[5:] in n]
    row(rc == 0 and not failing and bool(notes), f"failing={len(failing)} note: {notes[0][:90] if notes else None} {desc}")
elif expect.startswith("growth:"):
    _, file, line, *ranks = expect.split(":")
    hits = [
        f for f in failing
        if f["kind"] == "growth" and any((fr.get("file") or "").endswith(file) and fr.get("line") == int(line) for fr in f["frames"])
    ]
    ranked = not ranks or all(set(map(str, (p.get("rank") for p in f["processes"]))) == set(ranks[0].split(",")) for f in hits)
    row(rc == 23 and bool(hits) and ranked, f"growth at {file}:{line}: {len(hits)} finding(s); all: {desc}")
elif expect.startswith("exit:"):
    _, file, line = expect.split(":")
    hits = [
        f for f in failing
        if f["kind"] == "exit" and any((fr.get("file") or "").endswith(file) and fr.get("line") == int(line) for fr in f["frames"])
    ]
    row(rc == 23 and bool(hits), f"exit leak at {file}:{line}: {len(hits)} finding(s); all: {desc}")
elif expect.startswith("test:"):
    want, *at = expect[5:].split(":")
    tests = [f for f in failing if f["kind"] == "test"]
    ok = rc == 23 and len(tests) == 1 and want in tests[0]["test"]
    if ok and at:
        # The line named: the test's own frame, where the finding points.
        f = tests[0]
        u = f["frames"][f["user_frame"]] if "user_frame" in f else {}
        ok = (u.get("file") or "").endswith(at[0]) and u.get("line") == int(at[1])
    row(ok, f"test findings: {[f['test'] for f in tests]}; all: {desc}")
elif expect.startswith("budget:"):
    want = expect[7:]
    over = doc.get("budgets", [])
    ok = rc == 23 and not failing and len(over) == 1 and want in over[0]["what"]
    row(ok, f"budgets: {[(o['budget'], o['what'], o['bytes']) for o in over]}; leaks: {desc}")
elif expect.startswith("status:"):
    row(rc == int(expect[7:]), f"failing={len(failing)} {desc}")
elif expect.startswith("sanitizer:"):
    text = open(expect[10:]).read()
    sanitizer = sorted(int(n.replace(",", "")) for n in re.findall(r"Leaked ([\d,]+) bytes", text))
    ours = sorted(f["bytes"] // max(f["count"], 1) for f in failing if f["kind"] == "exit" for _ in range(f["count"]))
    row(rc == 23 and sanitizer == ours and sanitizer, f"compute-sanitizer {sanitizer} cupool {ours}")

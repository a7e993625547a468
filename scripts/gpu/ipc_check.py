"""Two processes share CUDA memory through IPC handles (scripts/gpu/ipc.cu):
the exporter and the importer each run plainly or under `cupool run`, and the
importer must see each block's own bytes, or get an error — never another
block's. Prints one `result:` line per combination.

With BACKING=vmm the pool carves the blocks from VMM pages, which legacy IPC
cannot name: every handle of a pooled block is then sealed, so a receiver
outside cupool is refused all four, and one under cupool maps the pages.

usage: ipc_check.py IPC_BINARY CUPOOL_BINARY LOG_DIR [BACKING]"""
import subprocess, sys, threading

ipc, cupool, logs = sys.argv[1:4]
backing = sys.argv[4] if len(sys.argv) > 4 else "segments"

def launch(mode, role, tag):
    cmd = [ipc, role] if mode == "plain" else [cupool, "run", "-q", "--mode", mode, "-o", f"backing={backing}", "--log-dir", f"{logs}/{tag}-{role}", "--", ipc, role]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

def until(proc, word):
    lines = []
    for line in proc.stdout:
        lines.append(line.strip())
        if line.startswith(word):
            break
    return lines

def combo(exporter_mode, importer_mode):
    tag = f"{exporter_mode}-{importer_mode}"
    ex = launch(exporter_mode, "export", tag)
    im = None
    # A process that never answers must not hang the check: kill both.
    def kill():
        for p in (ex, im):
            if p and p.poll() is None:
                p.kill()
        print(f"result: {tag} ok=0 timed out", flush=True)
    watchdog = threading.Timer(40, kill)
    watchdog.start()
    try:
        body(ex, tag, lambda: launch(importer_mode, "import", tag), exporter_mode, importer_mode)
    finally:
        watchdog.cancel()

def body(ex, tag, start_importer, exporter_mode, importer_mode):
    handles = until(ex, "distance_b_a")
    im = start_importer()
    for h in handles:
        if h.startswith("H "):
            im.stdin.write(h + "\n")
    im.stdin.write("END\n")
    im.stdin.flush()
    opened = until(im, "opened")
    ex.stdin.write("free\n"); ex.stdin.flush()
    until(ex, "freed")
    im.stdin.write("recheck\n"); im.stdin.flush()
    rest = [l.strip() for l in im.stdout]
    ex.stdin.write("exit\n"); ex.stdin.flush()
    ex.wait(); im.wait()
    seen = {}
    for l in opened + rest:
        parts = l.split()
        if parts and parts[0] in ("open", "recheck"):
            kv = dict(p.split("=") for p in parts[2:])
            seen.setdefault(parts[1], []).append(kv.get("rc", "0") + ":" + kv["byte"])
    want = {"a": "aa", "b": "bb", "b_driver": "bb", "b_interior": "bb"}
    wrong = []
    for name, byte in want.items():
        got = seen.get(name, [])
        ok_open = got and got[0] == f"0:{byte}" and all(g.endswith(byte) for g in got)
        refused = got and got[0].split(":")[0] != "0"
        if not (ok_open or refused):
            wrong.append(f"{name}={got}")
    refused = sorted(n for n, g in seen.items() if g and g[0].split(':')[0] != '0')
    # Only a receiver outside cupool may be refused, and only the blocks a
    # pool placed past the start of their segment.
    expect_refused = []
    if (exporter_mode, importer_mode) == ("pool", "plain"):
        expect_refused = ["a", "b", "b_driver", "b_interior"] if backing == "vmm" else ["b", "b_driver", "b_interior"]
    if refused != expect_refused:
        wrong.append(f"refused={refused} expected {expect_refused}")
    distance = next((h.split()[1] for h in handles if h.startswith("distance_b_a")), "?")
    closed = next((l for l in rest if l.startswith("closed")), "closed ?")
    # IPC_CLOSE_IN_CAPTURE (inherited by the importer): its closes ran
    # during a relaxed capture, whose end says whether they broke it.
    closed += "".join(" " + l.replace(" ", "=") for l in rest if l.startswith(("capture_end", "range_after_close")))
    if ex.returncode or im.returncode:
        wrong.append(f"exit codes {ex.returncode}/{im.returncode}")
    verdict = "ok=0" if wrong else "ok=1"
    print(f"result: {backing} {tag} {verdict} wrong={wrong} refused={refused} b_minus_a={distance} {closed.replace(' ', '=', 1)}", flush=True)

for e, i in [("passthrough", "plain"), ("pool", "pool"), ("pool", "plain"), ("pool", "passthrough")]:
    combo(e, i)

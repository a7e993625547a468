"""Checks one gpu-check.sh case: cupool's logs against the program's own
ground truth (and compute-sanitizer's leak report where given). Prints one
table row: case | verdict | figures."""
import glob, json, os, re, sys

case, logdir, plain_out, shim_out = sys.argv[1:5]
sanitizer = sys.argv[5] if len(sys.argv) > 5 else None

def result_line(path):
    for line in open(path, errors="replace"):
        if line.startswith("result:"):
            return dict(kv.split("=", 1) for kv in line.split()[1:])
    return {}

def stable(path):
    # Lines that must not change under the shim (timings excluded).
    return [l for l in open(path, errors="replace") if not re.search(r"ms|time|sec", l)]

# `cupool run` writes each run into a directory of its own; `latest` names it.
if os.path.isdir(f"{logdir}/latest"):
    logdir = f"{logdir}/latest"
logs = [json.load(open(p)) for p in sorted(glob.glob(f"{logdir}/cupool.*.json"))]
allocs, by_api, frees, leaks, complete = 0, {}, 0, [], all("end" in l for l in logs)
for log in logs:
    for e in log["events"]:
        if e.get("ev") == "alloc" and e.get("kind", "device") not in ("host", "vmm"):  # programs count neither
            allocs += 1
            api = e.get("api", "cudaMalloc")  # left out at its default (log version 5)
            by_api[api] = by_api.get(api, 0) + 1
        elif e.get("ev") == "free" and e.get("kind", "device") not in ("host", "vmm"):
            frees += 1
    leaks += [l for l in log.get("end", {}).get("leaks", []) if l["kind"] != "host"]
truth = result_line(plain_out)
shim_truth = result_line(shim_out)
checks, figures = [], [f"allocs={allocs}", f"frees={frees}", "apis=" + ",".join(f"{k}:{v}" for k, v in sorted(by_api.items()))]
checks.append(("output unchanged", stable(plain_out) == stable(shim_out) and bool(truth)))
checks.append(("log complete", complete and len(logs) >= 1))
if "device_allocs" in truth:
    checks.append(("allocs == program's count", allocs == int(truth["device_allocs"])))
if "num_device_alloc" in shim_truth:
    n = int(shim_truth["num_device_alloc"])
    figures.append(f"torch_num_device_alloc={n}")
    if n > 0:  # PyTorch keeps no statistics with its cache off
        checks.append(("cudaMalloc calls == torch num_device_alloc", by_api.get("cudaMalloc", 0) == n))
    elif "tensors" in truth:
        checks.append(("cudaMalloc calls >= tensors made", by_api.get("cudaMalloc", 0) >= int(truth["tensors"])))
if "arrays" in truth:
    checks.append(("device allocs >= arrays made", allocs >= int(truth["arrays"])))
if "leaked_bytes" in truth:
    got = sum(l["size"] for l in leaks)
    figures.append(f"leaked={len(leaks)}/{got}B")
    checks.append(("leaked bytes == program's", got == int(truth["leaked_bytes"])))
if sanitizer:
    text = open(sanitizer, errors="replace").read()
    san = sorted(int(b.replace(",", "")) for b in re.findall(r"Leaked ([\d,]+) bytes", text))
    mine = sorted(l["size"] for l in leaks)
    figures.append(f"sanitizer={san}")
    checks.append(("leak sizes == compute-sanitizer's", san == mine))
failed = [name for name, ok in checks if not ok]
verdict = "PASS" if not failed else "FAIL: " + "; ".join(failed)
print(f"{case:<22} | {verdict:<40} | {' '.join(figures)}")

#!/usr/bin/env bash
# Large blocks: cudaMalloc + memset + cudaFree at 256 MiB, 1 GiB, 8 GiB and
# half the free memory, twice each, plainly, under the pool on VMM pages with
# every request pooled (direct_min=0), and with the default options (requests
# from 1 GiB up go to CUDA as they are). Same setup as scripts/gpu-check.sh
# (.gpu/ holds the shim and the CLI):
#   bash scripts/gpu-huge.sh           (prints a table of milliseconds last)
set -u
export PATH=/usr/local/cuda/bin:$PATH
root=$(pwd); bin=$root/.gpu; src=$(cd "$(dirname "$0")" && pwd)/gpu
work=$(mktemp -d /tmp/cupool-huge.XXXX)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
nvcc -O2 -cudart shared -o $work/huge_alloc $src/huge_alloc.cu || exit 1
$work/huge_alloc > $work/plain.out
$bin/cupool run -q --log-dir $work/logs0 -o direct_min=0 -- $work/huge_alloc > $work/pooled.out
$bin/cupool run -q --log-dir $work/logs1 -- $work/huge_alloc > $work/default.out
echo
echo "size MiB, cycle | alloc ms: plain, all pooled, default | free ms: plain, all pooled, default"
paste -d' ' $work/plain.out $work/pooled.out $work/default.out | python3 -c '
import re, sys
for line in sys.stdin:
    runs = [dict(re.findall(r"(\w+)=([\d.]+)", part)) for part in line.split("result:")[1:]]
    row = lambda key: ", ".join(r.get(key, "err") for r in runs)
    print("%8s, %s | %s | %s" % (runs[0]["size_mib"], runs[0]["cycle"], row("alloc_ms"), row("free_ms")))
'

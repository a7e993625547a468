#!/usr/bin/env bash
# Records the example log that README.md's first recipe reads
# (examples/torch-leak/log/): examples/torch-leak/train.py, a PyTorch training
# loop with NVTX step phases and one planted leak, run under `cupool check`
# on a GPU. Same setup as scripts/gpu-leakcheck.sh: .gpu/ holds the CLI and
# the shim (cargo build --release && mkdir -p .gpu && cp
# target/release/{libcupool.so,cupool} .gpu/). Writes into $OUT/torch-leak/
# (else a temporary directory, printed): the logs gzipped
# (cupool.<pid>.json.gz), PyTorch's history beside them as written
# (cupool-torch.<pid>.json: the check reads it plain), the check's JSON and
# its report. Copy that directory's files into examples/torch-leak/log/ in
# place of those there, then run
# `cargo test --release --test example` and update README.md's output if it
# says so.
set -u
root=$(pwd); bin=$root/.gpu
out=${OUT:-$(mktemp -d /tmp/cupool-example.XXXX)}/torch-leak
work=$(mktemp -d /tmp/cupool-example-run.XXXX)
rm -rf "$out" && mkdir -p "$out"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
# From the repository root, so that the log's frames name examples/torch-leak/train.py.
$bin/cupool check --log-dir "$work/logs" --json "$out/check.json" -- python3 examples/torch-leak/train.py \
  > "$out/train.out" 2> "$out/check.txt"
echo "cupool check: exit $? (23 expected: the planted leak)"
cat "$out/train.out"
run=$(readlink -f "$work/logs/latest")
for f in "$run"/cupool.*.json; do gzip -9 -c "$f" > "$out/$(basename "$f").gz"; done
cp "$run"/cupool-torch.*.json "$out/" 2>/dev/null
$bin/cupool report "$out" > "$out/report.txt" 2>&1
$bin/cupool merge "$out" > "$out/merge.txt" 2>&1
echo "merge of the copied logs: exit $?"
grep -n 'LEAK\|ALLOCATED' examples/torch-leak/train.py
sed -n 1,40p "$out/check.txt"
ls -la "$out"
echo "files in $out"

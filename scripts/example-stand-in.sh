#!/usr/bin/env bash
# Makes the STAND-IN example log in examples/torch-leak/log/ on a machine
# without a GPU: examples/torch-leak/stand_in_fake_cuda.py under
# `cupool check`, against the fake CUDA runtime of tests/fake/ (built here
# with cc). scripts/gpu-example-log.sh records the real one on a GPU, which
# replaces it. Run from the repository root after cargo build --release.
set -eu
root=$(pwd); S=$root/tests/fake
# Run from a directory of its own, so that the log names no checkout.
work=/tmp/cupool-example
rm -rf "$work" && mkdir -p "$work/examples/torch-leak"
cp examples/torch-leak/stand_in_fake_cuda.py "$work/examples/torch-leak/"
cc -shared -fPIC -fvisibility=hidden -Wl,-soname,libcuda.so.1 -o "$work/libcuda.so.1" "$S/fake_cuda.c" -pthread
cc -shared -fPIC -fvisibility=hidden -Wl,-soname,libcudart.so.13 -Wl,-rpath,'$ORIGIN' \
   -o "$work/libcudart.so.13" "$S/fake_cudart.c" -ldl -pthread
out=examples/torch-leak/log
rm -f "$out"/cupool.*.json.gz "$out"/cupool-torch.*.json
status=0
# Python frames only (stack_depth=0), as the findings PyTorch's history gives
# have them: native frames would name this machine's Python build.
(cd "$work" && LD_LIBRARY_PATH=$work FAKE_CUDART=$work/libcudart.so.13 "$root/target/release/cupool" check \
  --log-dir logs -o stack_depth=0 -- python3 examples/torch-leak/stand_in_fake_cuda.py) || status=$?
echo "cupool check: exit $status (23 expected: the planted leak)"
for f in "$work"/logs/latest/cupool.*.json; do gzip -9 -n -c "$f" > "$out/$(basename "$f").gz"; done
ls -la "$out"
rm -rf "$work"

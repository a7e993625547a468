#!/usr/bin/env bash
# PyTorch's allocation history under `cupool check` on a real GPU (option
# torch_history, on by default): with PyTorch's caching allocator on, a loop
# that keeps one step's output per iteration must be a growth finding at the
# line that allocates it (scripts/gpu/train_loop.py; under torchrun, 2 ranks
# on one GPU with gloo, naming both ranks), a clean loop must pass; and the
# cost on the transformer workload, plain / cupool check / cupool check with
# torch_history=0, alternating. Same setup as scripts/gpu-leakcheck.sh (.gpu/
# holds the CLI and the shim). Prints a table last.
set -u
root=$(pwd); bin=$root/.gpu; src=$root/scripts/gpu; work=$(mktemp -d /tmp/cupool-torch-history.XXXX)
rows=(); t0=$SECONDS
python3 -c "import torch, inspect; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0)); print('_record_memory_history', inspect.signature(torch.cuda.memory._record_memory_history))"
allocated() { grep -n '# ALLOCATED' "$1" | cut -d: -f1; }

# check NAME EXPECT -- CMD...   (EXPECT as scripts/gpu/check_verdict.py takes it)
check() {
  local name=$1 expect=$2; shift 3
  local s=$SECONDS
  timeout ${LIMIT:-100} $bin/cupool check --log-dir $work/$name --json $work/$name.json -- "$@" > $work/$name.out 2> $work/$name.err
  local rc=$?
  local n size
  n=$(ls $work/$name/latest/cupool-torch.*.json 2>/dev/null | wc -l)
  size=$(cat $work/$name/latest/cupool-torch.*.json 2>/dev/null | wc -c)
  rows+=("$(python3 $src/check_verdict.py $name $rc $work/$name.json $expect) | $((SECONDS - s)) s; $n history file(s), $size bytes")
}
LEAK=1 check torch-leak-cache growth:train_loop.py:$(allocated $src/train_loop.py) -- python3 $src/train_loop.py
check torch-clean-cache clean -- python3 $src/train_loop.py
LEAK=1 check ddp-leak growth:ddp_loop.py:$(allocated $src/ddp_loop.py):0,1 -- torchrun --standalone --nproc_per_node 2 $src/ddp_loop.py
echo "== what a user sees (cache on, no marks)"
sed -n 1,24p $work/torch-leak-cache.err
echo "== the same under torchrun"
sed -n 1,30p $work/ddp-leak.err
grep -h "PyTorch's allocation history" $work/*.err | sort | uniq -c

echo "== overhead: transformer workload (30 timed iterations), plain / cupool check / cupool check -o torch_history=0"
T=$work/t.py; sed 's/N = 60/N = 30/' $src/torch_transformer.py > $T
for round in 1 2; do
  MODE=plain python3 $T
  MODE=check $bin/cupool check --log-dir $work/over-$round -- python3 $T 2> $work/over-$round.err
  echo "  (cupool check: exit $?, $(ls $work/over-$round/latest/cupool-torch.*.json 2>/dev/null | wc -l) history file(s))"
  MODE=check-no-history $bin/cupool check -o torch_history=0 --log-dir $work/overn-$round -- python3 $T 2> $work/overn-$round.err
  echo "  (cupool check -o torch_history=0: exit $?)"
done
tail -n 6 $work/over-1.err

if [ $((SECONDS - t0)) -lt 150 ]; then
  check ddp-clean clean -- torchrun --standalone --nproc_per_node 2 $src/ddp_loop.py
fi
tar czf ${OUT:-$work}/gpu-torch-history.tgz -C $work --exclude='./over-[12]/*' --exclude='./overn-[12]/*' . 2>/dev/null
echo
printf '%s\n' "${rows[@]}"
echo "total $((SECONDS - t0)) s"

#!/usr/bin/env bash
# The views on a real GPU. First, cupool's memory_viz export of a PyTorch run
# against PyTorch's own snapshot of the same run (scripts/gpu/memviz_compare.py:
# same live segments at the end, same peak, and PyTorch's _memory_viz code
# accepts the pickle), in pool mode (the default) and passthrough; and the HTML
# report of that run in a headless Chromium (scripts/html-check.sh) where this
# machine has one. Then the logs the HTML report's pictures are checked and
# drawn from, kept under $OUT/logs/ (gzipped), one directory each:
#   torch-cache      PyTorch training with its caching allocator (scripts/gpu/views_train.py)
#   torch-nocache    the same with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every tensor a cudaMalloc)
#   torch-segments   the cache off, cupool's pool on backing=segments (the pool laid out)
#   jax              JAX steps with XLA_PYTHON_CLIENT_ALLOCATOR=platform (where JAX is installed)
#   several          two training processes at once on the GPU
#   killed           a training run killed with SIGKILL mid-run
# their pages in $OUT/pages/, and `cupool top` watching a slow training run:
# screens every 2 s in $OUT/top-N.txt (from tmux where it is installed, else
# `cupool top` through a pipe). .gpu/ holds the CLI. Prints a table last.
# Afterwards, on a machine with Chromium (see docs/report.md):
#   CUPOOL_HTML_LOGS=$(ls -d OUT/logs/* | paste -sd:) cargo test --release --test html_browser
#   scripts/html-shots.sh OUT/logs/torch-cache OUT/logs/torch-nocache OUT/logs/torch-segments docs/img OUT/top-3.txt
set -u
root=$(pwd); bin=$root/.gpu; src=$root/scripts/gpu; work=$(mktemp -d /tmp/cupool-views.XXXX)
rows=(); t0=$SECONDS
for mode in pool passthrough; do
  d=$work/$mode; mkdir -p $d
  plain=$(python3 $src/memviz_compare.py run $d | tail -1)
  rm -f $d/torch.pickle $d/torch.json
  got=$($bin/cupool run -o mode=$mode --log-dir $d/logs -- python3 $src/memviz_compare.py run $d 2>$d/run.err | tail -1)
  $bin/cupool export --memory-viz $d/cupool.pickle $d/logs > $d/export.out 2>&1
  python3 $src/memviz_compare.py compare $d $d/cupool.pickle | tee $d/compare.out
  same=$([ "$plain" = "$got" ] && echo "same output" || echo "OUTPUT DIFFERS: $plain / $got")
  rows+=("memviz-$mode | $(tail -1 $d/compare.out) | $same")
  $bin/cupool report --html $d/report.html $d/logs > /dev/null 2>&1
done
echo "== browsers on this machine"
for b in chromium chromium-browser google-chrome google-chrome-stable headless_shell node; do
  command -v $b || true
done
python3 -c "import playwright; print('playwright', playwright.__version__)" 2>&1 | tail -1
ls ~/.cache/ms-playwright 2>/dev/null
log=$(ls $work/pool/logs/latest/cupool.*.json* | head -1)
bash $root/scripts/html-check.sh $work/pool/report.html "$log"
rc=$?
rows+=("html-check | exit $rc (0 pass, 1 fail, 77 no Chromium here)")
mkdir -p ${OUT:-$work}
cp $work/pool/report.html ${OUT:-$work}/ 2>/dev/null
[ -f $work/pool/report.png ] && cp $work/pool/report.png ${OUT:-$work}/

# The logs of the pictures.
out=${OUT:-$work}; logs=$out/logs; pages=$out/pages; mkdir -p $logs $pages
train=$src/views_train.py
views() {  # NAME ENV... -- : one cupool run of the training workload
  local name=$1; shift
  env "$@" $bin/cupool run --log-dir $logs/$name -- python3 $train > $work/$name.out 2>&1
  local rc=$?
  rows+=("$name | $(grep -h 'result:' $work/$name.out | tail -1) | exit $rc")
}
views torch-cache STEPS=60
views torch-nocache STEPS=30 PYTORCH_NO_CUDA_MEMORY_CACHING=1
views torch-segments STEPS=30 PYTORCH_NO_CUDA_MEMORY_CACHING=1 CUPOOL_OPTIONS=backing=segments
if python3 -c "import jax" 2>/dev/null; then
  XLA_PYTHON_CLIENT_ALLOCATOR=platform $bin/cupool run --log-dir $logs/jax -- python3 $src/jax_step.py > $work/jax.out 2>&1
  rows+=("jax | $(grep -h 'result:' $work/jax.out | tail -1)")
else
  rows+=("jax | not installed here")
fi
# Two processes at once.
for i in 1 2; do
  STEPS=40 $bin/cupool run --log-dir $logs/several -- python3 $train > $work/several-$i.out 2>&1 &
done
wait
rows+=("several | $(grep -h 'result:' $work/several-*.out | wc -l) of 2 finished")
# Killed mid-run: the log has no end record.
STEPS=100000 LEAK=1 SLOW=0.05 $bin/cupool run --log-dir $logs/killed -- python3 $train > $work/killed.out 2>&1 &
sleep 15
pkill -KILL -f "$train"
wait
rows+=("killed | $(ls $logs/killed/ 2>/dev/null | wc -l) log(s)")
# cupool top while a slow run trains.
STEPS=50 SLOW=0.2 LEAK=1 $bin/cupool run --log-dir $logs/top -- python3 $train > $work/top.out 2>&1 &
run_pid=$!
sleep 3
if command -v tmux >/dev/null; then
  tmux new-session -d -s cupool-views -x 110 -y 30 "$bin/cupool top -d 0.5 $logs/top"
  for n in 1 2 3 4 5; do sleep 2; tmux capture-pane -p -t cupool-views > $out/top-$n.txt; done
  tmux send-keys -t cupool-views q; sleep 1; tmux kill-session -t cupool-views 2>/dev/null
  how=tmux
else
  $bin/cupool top -n 6 -d 2 $logs/top > $out/top-pipe.txt
  awk -v RS='cupool top: ' 'NR>1 {f=sprintf("'$out'/top-%d.txt", NR-1); printf "cupool top: %s", $0 > f}' $out/top-pipe.txt
  how=pipe
fi
wait $run_pid
rows+=("top ($how) | $(ls $out/top-*.txt | wc -l) screen(s); last: $(grep -m1 -A2 'device' $out/top-5.txt 2>/dev/null | tail -1)")
for d in $logs/*/; do
  name=$(basename $d)
  $bin/cupool report --html $pages/$name.html $d > /dev/null 2>$work/$name.report
  rows+=("page $name | $(tail -1 $work/$name.report)")
done
find $logs -name 'cupool.*.json' -exec gzip -f {} +
echo
printf '%s\n' "${rows[@]}"
echo "total $((SECONDS - t0)) s"

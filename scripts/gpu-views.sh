#!/usr/bin/env bash
# Issue 13 on a real GPU: cupool's memory_viz export of a PyTorch run against
# PyTorch's own snapshot of the same run (scripts/gpu/memviz_compare.py: same
# live segments at the end, same peak, and PyTorch's _memory_viz code accepts
# the pickle), in pool mode (the default) and passthrough; and the HTML report
# of that run in a headless Chromium (scripts/html-check.sh) where this
# machine has one. .gpu/ holds the CLI. Prints a table last.
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
echo
printf '%s\n' "${rows[@]}"
echo "total $((SECONDS - t0)) s"

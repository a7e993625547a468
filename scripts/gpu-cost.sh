#!/usr/bin/env bash
# What `cupool check` costs a CI job, whole processes timed side by side
# (start-up, history recording and the final symbolising included): a
# pytest suite of short CUDA tests, a short training script, a JAX loop with
# its array history on, and the transformer benchmark's ms/iter. Rounds
# alternate plain and checked runs; the table gives each one's median and
# the ratio. Same setup as scripts/gpu-leakcheck.sh (.gpu/ holds the CLI).
# WORKLOADS picks some (default: all four); each is run once plainly before
# the rounds, so that no round reads a cold file cache.
set -u
root=$(pwd); bin=$root/.gpu; src=$root/scripts/gpu; work=$(mktemp -d /tmp/cupool-cost.XXXX)
ROUNDS=${ROUNDS:-3}
WORKLOADS=${WORKLOADS:-pytest train jax transformer}
for w in $WORKLOADS; do
  case $w in pytest|train|jax|transformer) ;; *) echo "gpu-cost.sh: unknown workload $w (pytest, train, jax, transformer)" >&2; exit 2 ;; esac
done
python3 -m pytest --version >/dev/null 2>&1 || {
  python3 -m pip install -q --no-index --target $work/py $bin/pywheels/*.whl && export PYTHONPATH=$work/py${PYTHONPATH:+:$PYTHONPATH}
}
export XLA_PYTHON_CLIENT_PREALLOCATE=false
T=$work/transformer.py; sed 's/N = 60/N = 20/' $src/torch_transformer.py > $T

# wall NAME ROUND -- CMD...: appends "NAME seconds" to $work/times
wall() {
  local name=$1; shift 3
  local t0=$EPOCHREALTIME
  "$@" > $work/$name.out 2> $work/$name.err
  awk -v n=$name -v a=$t0 -v b=$EPOCHREALTIME 'BEGIN { printf "%s %.3f\n", n, b - a }' >> $work/times
}
on() { [[ " $WORKLOADS " == *" $1 "* ]]; }
on pytest && python3 -m pytest -q -p no:cacheprovider $src/pytest_cost > /dev/null 2>&1
on train && python3 $src/train_loop.py > /dev/null 2>&1
on jax && python3 $src/jax_loop.py > /dev/null 2>&1
on transformer && MODE=plain python3 $T > /dev/null 2>&1
touch $work/iters $work/times
for r in $(seq $ROUNDS); do
  if on pytest; then
    wall pytest-plain $r -- python3 -m pytest -q -p no:cacheprovider $src/pytest_cost
    wall pytest-check $r -- $bin/cupool check --log-dir $work/l -- python3 -m pytest -q -p no:cacheprovider $src/pytest_cost
  fi
  if on train; then
    wall train-plain $r -- python3 $src/train_loop.py
    wall train-check $r -- $bin/cupool check --log-dir $work/l -- python3 $src/train_loop.py
  fi
  if on jax; then
    wall jax-plain $r -- python3 $src/jax_loop.py
    wall jax-check $r -- $bin/cupool check --log-dir $work/l -- python3 $src/jax_loop.py
  fi
  if on transformer; then
    MODE=plain wall transformer-plain $r -- python3 $T
    grep -h mode= $work/transformer-plain.out >> $work/iters
    MODE=check wall transformer-check $r -- $bin/cupool check --log-dir $work/l -- python3 $T
    grep -h mode= $work/transformer-check.out >> $work/iters
  fi
  rm -rf $work/l
done
cat $work/iters
python3 - "$work/times" "$work/iters" <<'PY'
import re, statistics, sys
times = {}
for line in open(sys.argv[1]):
    name, s = line.split()
    times.setdefault(name, []).append(float(s))
iters = {}
for line in open(sys.argv[2]):
    m = re.search(r"mode=(\S+) ms/iter=([\d.]+)", line)
    iters.setdefault(m[1], []).append(float(m[2]))
print(f"{'workload':22} | {'plain':>9} | {'check':>9} | ratio")
for w in ["pytest", "train", "jax", "transformer"]:
    if f"{w}-plain" not in times:
        continue
    p, c = statistics.median(times[f"{w}-plain"]), statistics.median(times[f"{w}-check"])
    print(f"{w + ' (whole, s)':22} | {p:9.2f} | {c:9.2f} | {c / p:.3f}")
if iters:
    p, c = statistics.median(iters["plain"]), statistics.median(iters["check"])
    print(f"{'transformer (ms/iter)':22} | {p:9.2f} | {c:9.2f} | {c / p:.3f}")
PY

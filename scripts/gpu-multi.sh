#!/usr/bin/env bash
# cupool on two GPUs: pooled blocks and peer access (runtime and driver API,
# static and shared cudart), NCCL on pooled memory (ncclCommRegister,
# NCCL_CUMEM_ENABLE on and off), a two-rank torchrun DDP job with NCCL (same
# losses, ms/iter), and one verdict for the job from cupool check, merge and
# report. Skipped, with a line saying so, on a machine with fewer than two
# GPUs. Same setup as scripts/gpu-check.sh (.gpu/ holds the shim and the CLI):
#   bash scripts/gpu-multi.sh [peer] [nccl] [ddp] [check]   (all by default; a table last)
set -u
export PATH=/usr/local/cuda/bin:$PATH
root=$(pwd); bin=$root/.gpu; src=$root/scripts/gpu
work=$(mktemp -d /tmp/cupool-multi.XXXX)
rows=()
parts=${*:-peer nccl ddp check}
want() { [[ " $parts " == *" $1 "* ]]; }
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
[ -n "${CUDA_VISIBLE_DEVICES:-}" ] && gpus=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
if [ "$gpus" -lt 2 ]; then
  echo "two-GPU section skipped: this machine has $gpus GPU(s)"
  exit 0
fi
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
nvidia-smi topo -m | head -4
row() { rows+=("$(printf '%-30s | %s | %s' "$1" "$2" "$3")"); }

# same NAME -- CMD...: the program's result line plainly and under cupool
# (pool, the default) must be equal and say PASS.
same() {
  local name=$1; shift 2
  local plain shim
  plain=$(timeout 300 "$@" 2>$work/$name.plain.err | grep '^result:')
  shim=$(timeout 300 $bin/cupool run -q ${CUPOOL_FLAGS:-} --log-dir $work/$name -- "$@" 2>$work/$name.err | grep '^result:')
  local ok=FAIL
  [ -n "$plain" ] && [ "$plain" = "$shim" ] && [[ "$plain" == *PASS* ]] && ok=PASS
  row "$name" $ok "plain: ${plain#result: } | cupool: ${shim#result: }"
}

if want peer; then
  for rt in shared static; do
    nvcc -O2 -arch=native -cudart $rt -o $work/peer_$rt $src/peer.cu -lcuda
    for api in runtime driver; do same peer-$api-$rt -- $work/peer_$rt $api; done
  done
  CUPOOL_FLAGS="--mode passthrough" same peer-runtime-shared-passthrough -- $work/peer_shared runtime
  # Segments kept: reuse is decided by the fences alone.
  CUPOOL_OPTIONS=give_back=never same peer-runtime-shared-keep -- $work/peer_shared runtime
  CUPOOL_OPTIONS=give_back=never same peer-driver-static-keep -- $work/peer_static driver
  echo "== what cudaFree promises while another device still reads the block"
  timeout 60 $work/peer_shared probe 2>&1 | sed 's/^/plain:  /'
  timeout 60 $bin/cupool run -q --log-dir $work/probe -- $work/peer_shared probe 2>&1 | sed 's/^/cupool: /'
fi

if want nccl; then
  # NCCL's headers and library come with PyTorch's wheels (nvidia-nccl).
  nccl=$(python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null)
  [ -f "$nccl/include/nccl.h" ] || nccl=$(dirname "$(dirname "$(find / -name nccl.h -path '*include*' 2>/dev/null | head -1)")")
  if [ -f "$nccl/include/nccl.h" ]; then
    nvcc -O2 -arch=native -cudart shared -I$nccl/include -o $work/nccl_reg $src/nccl_reg.cu -L$nccl/lib -l:libnccl.so.2 -Xlinker -rpath=$nccl/lib
    for cumem in 0 1; do NCCL_CUMEM_ENABLE=$cumem same nccl-register-cumem$cumem -- $work/nccl_reg; done
  else
    row nccl-register SKIP "no nccl.h found"
  fi
fi

# losses NAME FILE...: every rank's loss bits from the runs' outputs, one line per run.
loss_of() { grep -ho 'rank=[0-9]* loss_sum=[^ ]*' "$1" | sort | tr '\n' ' '; }
# both_ranks LOSSES: the losses name rank 0 and rank 1 (a run that lost a rank is no match).
both_ranks() { [[ "$1" == *"rank=0 "* && "$1" == *"rank=1 "* ]]; }
ms_of() { grep -ho 'ms_iter=[0-9.]*' "$1" | sed 's/ms_iter=//' | sort -n | tail -1; }
tr_run() { timeout 300 torchrun --standalone --nproc_per_node 2 $src/ddp_nccl.py; }

if want ddp; then
  ref=$work/ddp-plain.out
  # Side by side, alternating: plain, cupool, plain, cupool, plain, cupool.
  for round in 1 2 3; do
    tr_run > $work/ddp-plain-$round.out 2>$work/ddp-plain-$round.err
    timeout 300 $bin/cupool run -q --log-dir $work/ddp-pool-$round -- torchrun --standalone --nproc_per_node 2 \
      $src/ddp_nccl.py > $work/ddp-pool-$round.out 2>$work/ddp-pool-$round.err
  done
  cp $work/ddp-plain-1.out $ref
  base=$(loss_of $ref)
  plain_ms=$(for r in 1 2 3; do ms_of $work/ddp-plain-$r.out; done | sort -n | sed -n 2p)
  pool_ms=$(for r in 1 2 3; do ms_of $work/ddp-pool-$r.out; done | sort -n | sed -n 2p)
  same_losses=PASS
  for r in 1 2 3; do
    [ "$(loss_of $work/ddp-plain-$r.out)" = "$base" ] && [ "$(loss_of $work/ddp-pool-$r.out)" = "$base" ] || same_losses=FAIL
  done
  both_ranks "$base" || same_losses=FAIL
  row ddp-nccl-losses $same_losses "$base"
  ratio=$(python3 -c "print(f'{$pool_ms/$plain_ms:.3f}')" 2>/dev/null)
  row ddp-nccl-ms-iter "$(python3 -c "print('PASS' if $ratio <= 1.02 else 'MISS')" 2>/dev/null || echo FAIL)" \
    "median of 3: plain $plain_ms ms, cupool $pool_ms ms, ratio $ratio (target <= 1.02)"
  # NCCL's variants: legacy IPC buffers, PyTorch registering its segments with NCCL, cache off with the pool.
  variant() {
    local name=$1; shift
    env "$@" timeout 300 torchrun --standalone --nproc_per_node 2 $src/ddp_nccl.py > $work/$name-plain.out 2>$work/$name-plain.err
    env "$@" timeout 300 $bin/cupool run -q --log-dir $work/$name -- torchrun --standalone --nproc_per_node 2 \
      $src/ddp_nccl.py > $work/$name-pool.out 2>$work/$name-pool.err
    local a b; a=$(loss_of $work/$name-plain.out); b=$(loss_of $work/$name-pool.out)
    row $name "$(both_ranks "$a" && [ "$a" = "$b" ] && echo PASS || echo FAIL)" "plain: $a| cupool: $b"
    tail -n 3 $work/$name-pool.err | sed "s/^/[$name] /"
  }
  variant ddp-nccl-cumem0 NCCL_CUMEM_ENABLE=0
  variant ddp-nccl-register TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1
  variant ddp-nccl-register-cumem0 TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1 NCCL_CUMEM_ENABLE=0
  variant ddp-nccl-nocache PYTORCH_NO_CUDA_MEMORY_CACHING=1 STEPS=60
fi

if want check; then
  line=$(grep -n '# ALLOCATED' $src/ddp_nccl.py | cut -d: -f1)
  check() {
    local name=$1 expect=$2; shift 3
    env "$@" timeout 300 $bin/cupool check --log-dir $work/$name --json $work/$name.json -- \
      torchrun --standalone --nproc_per_node 2 $src/ddp_nccl.py > $work/$name.out 2> $work/$name.err
    local rc=$?
    rows+=("$(python3 $src/check_verdict.py $name $rc $work/$name.json $expect)")
  }
  check check-ddp-nccl-clean clean -- STEPS=60
  check check-ddp-nccl-leak-rank1 growth:ddp_nccl.py:$line:1 -- STEPS=60 LEAK_RANK=1
  check check-ddp-nccl-nocache-clean clean -- STEPS=60 PYTORCH_NO_CUDA_MEMORY_CACHING=1
  sed -n 1,30p $work/check-ddp-nccl-leak-rank1.err
  # The per-rank logs copied into one directory give the same verdict.
  mkdir -p $work/merged && cp $work/check-ddp-nccl-leak-rank1/latest/* $work/merged/
  $bin/cupool merge --json $work/merged.json $work/merged > $work/merged.out 2>&1
  rc=$?
  same=$(python3 - $work/check-ddp-nccl-leak-rank1.json $work/merged.json <<'EOF'
import json, sys
def key(path):
    return sorted((f["kind"], f["bytes"], f["count"], str(f.get("frames", [])[:3]), str(sorted(str(p.get("rank")) for p in f["processes"])))
                  for f in json.load(open(path))["findings"])
a, b = key(sys.argv[1]), key(sys.argv[2])
print("same" if a == b and a else f"differ: {len(a)} vs {len(b)} findings")
EOF
)
  row merge-per-rank-logs "$([ $rc = 23 ] && [ "$same" = same ] && echo PASS || echo FAIL)" "rc=$rc findings $same as check's"
  $bin/cupool report $work/check-ddp-nccl-leak-rank1 > $work/report.txt 2>&1
  seen=$(for w in "(rank 0)" "(rank 1)" "device 0" "device 1"; do grep -qF "$w" $work/report.txt && echo -n "$w; "; done)
  row report-both-ranks "$([ "$seen" = "(rank 0); (rank 1); device 0; device 1; " ] && echo PASS || echo FAIL)" "shows $seen"
  sed -n 1,40p $work/report.txt
fi

tar czf ${OUT:-$work}/gpu-multi.tgz -C $work . 2>/dev/null
echo
printf '%s\n' "${rows[@]}"

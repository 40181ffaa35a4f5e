#!/usr/bin/env bash
# One build's closing call: bf16 parity on all four shapes, memcheck over the narrow shapes
# (production, mha) at T = 1000, the full 64k sweep, and the production anchors at every
# length, from the same call. From the repository root, with .carry/whl and
# .carry/bench_torch.py: `bash bench/gpu/final-check.sh .carry/x/nsa.xz`. With BASE=.carry/y/nsa.xz,
# the production shape at 64k of that build and this one, alternated over two rounds, too.
# ITERS (default 5) sets the sweep's runs per case. CHECKS=0 skips parity and memcheck, for a
# build whose exact binary passed them earlier in the session (say which call in the docs).
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt
bin=/tmp/nsa-final; xz -dc "$1" > $bin && chmod +x $bin
if [ "${CHECKS:-1}" != 0 ]; then
timeout ${PARITY_S:-200} $bin bench-kernels --backend cuda --precision bf16 --check-len 777 --lengths 64 --iters 1 \
  --shapes production,paper,wide,mha 2>&1 | grep -v '^|' | tee $OUT/parity.txt
timeout ${MEMCHECK_S:-130} compute-sanitizer --tool memcheck --error-exitcode 9 \
  $bin bench-kernels --backend cuda --precision bf16 --iters 1 --check-len 0 --lengths 1000 --shapes production,mha \
  > $OUT/memcheck.txt 2>&1
echo "memcheck exit $?" | tee -a $OUT/memcheck.txt; tail -3 $OUT/memcheck.txt
fi
timeout ${SWEEP_S:-260} $bin bench-kernels --backend cuda --precision bf16 --check-len 0 --iters ${ITERS:-5} 2>&1 | tee $OUT/sweep.txt
if [ -n "${BASE:-}" ]; then
  base=/tmp/nsa-base; xz -dc "$BASE" > $base && chmod +x $base
  for round in 1 2; do
    for b in $base $bin; do
      echo "== $b (round $round)" | tee -a $OUT/ab.txt
      timeout 120 $b bench-kernels --backend cuda --precision bf16 --check-len 0 --lengths 65536 --iters 5 \
        --shapes production 2>&1 | grep '^| production' | tee -a $OUT/ab.txt
    done
  done
fi
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl
PYTHONPATH=/tmp/site timeout ${ANCHOR_S:-100} python3 bench/gpu/anchor_attn.py 1,2048,12,2,64 1,8192,12,2,64 \
  1,16384,12,2,64 1,32768,12,2,64 1,65536,12,2,64 2>&1 | tee $OUT/anchor-production.txt

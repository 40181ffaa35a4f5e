#!/usr/bin/env bash
# Two builds in one device call: the candidate's bf16 parity on all four shapes (as
# quick-check.sh), then 64k timings of the baseline and the candidate, alternated, each kernel's
# own time (ncu) for the production shape, and the production anchors. From the repository
# root, with .carry/whl: `bash bench/gpu/ab-check.sh .carry/base/nsa.xz .carry/new/nsa.xz`.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt
base=/tmp/nsa-base; new=/tmp/nsa-new
xz -dc "$1" > $base && chmod +x $base; xz -dc "$2" > $new && chmod +x $new
for s in "2049 production" "777 paper" "777 wide,mha"; do
  set -- $s
  timeout 150 $new bench-kernels --backend cuda --precision bf16 --check-len $1 --lengths 64 --iters 1 --shapes $2 2>&1 \
    | grep -v '^|' | tee -a $OUT/parity.txt
done
for round in 1 2; do
  for b in base new; do
    echo "== $b (round $round)" | tee -a $OUT/time.txt
    timeout 150 /tmp/nsa-$b bench-kernels --backend cuda --precision bf16 --check-len 0 --lengths 65536 --iters 5 2>&1 | tee -a $OUT/time.txt
  done
done
for b in base new; do
  echo "== $b" | tee -a $OUT/kernel-times.txt
  rm -f /tmp/nsa; cp /tmp/nsa-$b /tmp/nsa
  NCU_S=150 bash bench/gpu/kernel-times.sh unused ${NCU_SHAPES:-production} 2>&1 | tee -a $OUT/kernel-times.txt
done
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl
PYTHONPATH=/tmp/site timeout 90 python3 bench/gpu/anchor_attn.py 1,65536,12,2,64 2>&1 | tee $OUT/anchor.txt

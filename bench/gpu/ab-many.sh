#!/usr/bin/env bash
# One baseline and several candidates in one device call: each candidate's bf16 parity on all
# four shapes, 64k timings of every build alternated over two rounds, the key kernels'
# registers, occupancy and time (ncu) per build, and the production anchors. From the
# repository root, with .carry/whl:
# `bash bench/gpu/ab-many.sh .carry/base/nsa.xz .carry/a/nsa.xz .carry/b/nsa.xz`.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt
names=()
for i in $(seq 1 $#); do
  xz -dc "${!i}" > /tmp/nsa-$i && chmod +x /tmp/nsa-$i; names+=($i)
  echo "build $i: ${!i}" | tee -a $OUT/builds.txt
done
for i in "${names[@]:1}"; do
  for s in "2049 production" "777 paper" "777 wide,mha"; do
    set -- $s
    echo "== parity, build $i, $2" | tee -a $OUT/parity.txt
    timeout 150 /tmp/nsa-$i bench-kernels --backend cuda --precision bf16 --check-len $1 --lengths 64 --iters 1 --shapes $2 2>&1 \
      | grep -v '^|' | tee -a $OUT/parity.txt
  done
done
for round in 1 2; do
  for i in "${names[@]}"; do
    echo "== build $i (round $round)" | tee -a $OUT/time.txt
    timeout 150 /tmp/nsa-$i bench-kernels --backend cuda --precision bf16 --check-len 0 --lengths 65536 --iters 5 ${SHAPES:+--shapes $SHAPES} 2>&1 | tee -a $OUT/time.txt
  done
done
for i in "${names[@]}"; do
  for skip in 0 2; do
    echo "== build $i: attention_key_flash (skip $skip)" | tee -a $OUT/limits.txt
    timeout 90 ncu --kernel-name-base function -k regex:attention_key_flash --launch-skip $skip --launch-count 1 \
      --section LaunchStats --section Occupancy --section SpeedOfLight \
      /tmp/nsa-$i bench-kernels --backend cuda --precision bf16 --check-len 0 --lengths 65536 --iters 1 --shapes production 2>&1 |
      grep -E "Duration|Registers Per|Block Limit Reg|Achieved Occ|Compute \(SM\) Thr|Memory Thr" | sed 's/  */ /g' | tee -a $OUT/limits.txt
  done
done
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl
PYTHONPATH=/tmp/site timeout 90 python3 bench/gpu/anchor_attn.py 1,65536,12,2,64 2>&1 | tee $OUT/anchor.txt

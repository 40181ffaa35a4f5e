#!/usr/bin/env bash
# Tensor-core window forward: parity (bf16, T = 333, padded rows) and 64k timings of one or more
# builds, then the attention anchors at the same shapes. From the repository root:
# `bench/gpu/window-mma.sh .carry/nsa.xz [.carry/b/nsa.xz ...]`, with .carry/whl and
# .carry/bench_torch.py.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt
for packed in "$@"; do
  name=$(echo "$packed" | tr / _ | sed 's/^\.carry_//; s/\.xz$//')
  bin=/tmp/$name; xz -dc "$packed" > $bin && chmod +x $bin
  echo "== $packed" | tee -a $OUT/window-mma.txt
  timeout ${PARITY_S:-150} $bin bench-kernels --backend cuda --precision bf16 --check-len 333 --lengths 64 \
    --iters 1 --shapes ${PARITY_SHAPES:-paper,production} 2>&1 | grep -v '^|' | tee -a $OUT/window-mma.txt
  timeout ${TIME_S:-90} $bin bench-kernels --backend cuda --precision bf16 --check-len 0 --lengths 65536 \
    --iters 5 2>&1 | tee -a $OUT/window-mma.txt
done
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl
PYTHONPATH=/tmp/site timeout ${ANCHOR_S:-150} python3 bench/gpu/anchor_attn.py 1,65536,12,2,64 1,65536,64,4,128 \
  2>&1 | tee $OUT/anchor-attn.txt

#!/usr/bin/env bash
# The production window against flex_attention at 8k-64k, both sides measured several times in
# one call: ROUNDS (default 3) runs of `bench-kernels` at ITERS (default 20) runs per queue,
# alternated with as many runs of the anchors. From the repository root, with .carry/whl and
# .carry/bench_torch.py: `bash bench/gpu/window-rounds.sh .carry/x/nsa.xz`.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt
bin=/tmp/nsa-rounds; xz -dc "$1" > $bin && chmod +x $bin
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl
for r in $(seq 1 ${ROUNDS:-3}); do
  echo "== round $r" | tee -a $OUT/rounds.txt
  timeout 150 $bin bench-kernels --backend cuda --precision bf16 --check-len 0 --lengths 8192,16384,32768,65536 \
    --iters ${ITERS:-20} --shapes production 2>&1 | grep '^| production | [0-9]* | window' | tee -a $OUT/rounds.txt
  PYTHONPATH=/tmp/site timeout 100 python3 bench/gpu/anchor_attn.py 1,8192,12,2,64 1,16384,12,2,64 1,32768,12,2,64 \
    1,65536,12,2,64 2>&1 | grep swa_fb | tee -a $OUT/rounds.txt
done

#!/usr/bin/env bash
# 125M NSA bf16 training with the fused kernels (steps as given, default 60), kernel cache kept in
# $OUT/kcache.tgz for later calls. From the repository root, with .carry/nsa.xz and optionally
# .carry/kcache.tgz.
set -u
[ -x .carry/nsa ] || { xz -d -k .carry/nsa.xz && chmod +x .carry/nsa; }
[ -f .carry/kcache.tgz ] && tar xzf .carry/kcache.tgz -C /tmp
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > /tmp/mem.txt & smi=$!
timeout ${TRAIN_S:-540} .carry/nsa train --config configs/bench/nsa-125m-b1.toml --backend cuda --precision bf16 \
  --steps ${STEPS:-60} --out /tmp/r-nsa --no-dashboard --kernel-cache /tmp/kcache 2>&1 |
  while IFS= read -r l; do echo "$(date +%s.%N | cut -c1-14) $l"; done > $OUT/train-nsa-kernels.txt
kill $smi; echo "peak MiB $(sort -n /tmp/mem.txt | tail -1)" | tee -a $OUT/train-nsa-kernels.txt
cp /tmp/r-nsa/metrics.jsonl $OUT/metrics-nsa-kernels.jsonl 2>/dev/null
tar czf $OUT/kcache.tgz -C /tmp kcache

#!/usr/bin/env bash
# The 125M bf16 training baseline on the lent GPU, the PyTorch anchor in the same call.
# From the repository root, with .carry/nsa.xz, .carry/kcache.tgz (kernel cache from an earlier
# call; optional, without it the first steps take ~6 min) and .carry/bench_torch.py.
set -u
[ -x .carry/nsa ] || { xz -d -k .carry/nsa.xz && chmod +x .carry/nsa; }
[ -f .carry/kcache.tgz ] && tar xzf .carry/kcache.tgz -C /tmp
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 python3 .carry/bench_torch.py train 2>&1 | tee $OUT/anchor.txt
for c in nsa dense; do
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > /tmp/mem-$c.txt & smi=$!
  timeout 150 .carry/nsa train --config configs/bench/$c-125m-b1.toml --backend cuda --precision bf16 --steps 200 \
    --out /tmp/r-$c --no-dashboard --kernel-cache /tmp/kcache 2>&1 |
    while IFS= read -r l; do echo "$(date +%s.%N | cut -c1-14) $l"; done > $OUT/train-$c-bf16.txt
  kill $smi; echo "$c peak MiB $(sort -n /tmp/mem-$c.txt | tail -1)" | tee -a $OUT/peak.txt
  cp /tmp/r-$c/metrics.jsonl $OUT/metrics-$c-bf16.jsonl
done

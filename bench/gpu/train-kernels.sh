#!/usr/bin/env bash
# 125M NSA bf16 training, by default with the fused kernels; `$1 = reference` runs the same
# config on the reference path (--reference-attention) for the same-call comparison. Steps as
# given (STEPS, default 60); the kernel cache is kept in $OUT/kcache.tgz for later calls. From the
# repository root, with .carry/nsa.xz and optionally .carry/kcache.tgz.
set -u
path=${1:-kernels}
flags=""; [ "$path" = reference ] && flags="--reference-attention"
[ -x .carry/nsa ] || { xz -d -k .carry/nsa.xz && chmod +x .carry/nsa; }
[ -f .carry/kcache.tgz ] && [ ! -d /tmp/kcache ] && tar xzf .carry/kcache.tgz -C /tmp
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > /tmp/mem-$path.txt & smi=$!
timeout ${TRAIN_S:-540} .carry/nsa train --config configs/bench/nsa-125m-b1.toml --backend cuda --precision bf16 \
  --steps ${STEPS:-60} --out /tmp/r-nsa-$path --no-dashboard --kernel-cache /tmp/kcache $flags 2>&1 |
  while IFS= read -r l; do echo "$(date +%s.%N | cut -c1-14) $l"; done > $OUT/train-nsa-$path.txt
kill $smi; echo "peak MiB $(sort -n /tmp/mem-$path.txt | tail -1)" | tee -a $OUT/train-nsa-$path.txt
cp /tmp/r-nsa-$path/metrics.jsonl $OUT/metrics-nsa-$path.jsonl 2>/dev/null
tar czf $OUT/kcache.tgz -C /tmp kcache

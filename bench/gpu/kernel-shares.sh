#!/usr/bin/env bash
# Kernel-level time shares of a bf16 training step (CubeCL's profiling log), plus peak memory
# from nvidia-smi during a plain run. Needs .carry/nsa.xz and .carry/kcache.tgz.
# Usage: bash bench/gpu/kernel-shares.sh <nsa|dense>...
set -u
cd "$(dirname "$0")/../.."
[ -x .carry/nsa ] || { xz -d -k .carry/nsa.xz && chmod +x .carry/nsa; }
K=/tmp/kcache
[ -d $K ] || tar xzf .carry/kcache.tgz -C /tmp
for c in "$@"; do
  cfg=configs/bench/$c-125m-b1.toml
  # peak memory of a plain 30-step run
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > /tmp/mem-$c.txt & smi=$!
  timeout 100 .carry/nsa train --config $cfg --backend cuda --precision bf16 --steps 30 --out /tmp/m-$c \
    --no-dashboard --kernel-cache $K 2>&1 | grep -E "step 30/|error" | cut -c1-160
  kill $smi; echo "$c peak MiB: $(sort -n /tmp/mem-$c.txt | tail -1)" | tee -a $OUT/peak.txt
  # every kernel timed (synchronising, so the total is inflated; the shares are what matter)
  R=$(pwd); mkdir -p /tmp/kp-$c
  printf '[profiling.logger]\nlevel = "basic"\nfile = "/tmp/kp-%s.log"\n' $c > /tmp/kp-$c/cubecl.toml
  sed -e 's/^log_every = .*/log_every = 2/' $cfg > /tmp/kp-$c/run.toml
  (cd /tmp/kp-$c && timeout 150 $R/.carry/nsa train --config run.toml --backend cuda --precision bf16 --steps 8 \
    --out /tmp/kpr-$c --data $R/data/corpus --no-dashboard --kernel-cache $K 2>&1 | grep -E "step 8/|error" | cut -c1-120)
  head -c 6000 /tmp/kp-$c.log > $OUT/kp-$c-head.txt; wc -l /tmp/kp-$c.log
  python3 bench/gpu/kernel_shares.py /tmp/kp-$c.log | tee $OUT/kernels-$c.txt
done

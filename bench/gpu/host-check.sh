#!/usr/bin/env bash
# Is a pipelined fwd+bwd bound by the host or by the device? One build's production runs at 2k,
# 8k, 16k and 64k, twice, with the SM clock and power logged every 200 ms (a clock that sags under
# load would make the in-situ kernels slower than ncu's); each kernel's own time at 16k (ncu at
# real clocks); and the anchors at 8k, 16k and 64k from the same call. From the repository root,
# with .carry/whl and .carry/bench_torch.py: `bash bench/gpu/host-check.sh .carry/x/nsa.xz`.
set -u
bin=/tmp/nsa-host; xz -dc "$1" > $bin && chmod +x $bin
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 200 > $OUT/clocks.txt &
smi=$!
for r in 1 2; do
  timeout 150 $bin bench-kernels --backend cuda --precision bf16 --check-len 0 --lengths 2048,8192,16384,65536 \
    --iters 10 --shapes production 2>&1 | grep '^| ' | tee -a $OUT/host.txt
done
kill $smi
awk -F', ' '{print $2}' $OUT/clocks.txt | sort | uniq -c | sort -rn | head -5
NCU_S=100 LENGTH=16384 MIN_MS=0 CLOCKS=none bash bench/gpu/kernel-times.sh "$1" production
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl
PYTHONPATH=/tmp/site timeout 100 python3 bench/gpu/anchor_attn.py 1,8192,12,2,64 1,16384,12,2,64 1,65536,12,2,64 \
  2>&1 | grep -E "swa|dense_fb|#" | tee $OUT/anchor.txt

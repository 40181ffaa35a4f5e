#!/usr/bin/env bash
# One build's check on the device: f32 and bf16 parity against the f64 CPU reference at
# T = 2049 (33 blocks: padded rows on CUDA, the window's lower bound, real selections), both
# shapes; 64k timings (TIME_S=0 skips); a per-kernel time split at 64k (CubeCL's profiling log,
# steady second half); then the attention anchors for ANCHORS (B,T,HQ,H,D ...). From the
# repository root, with .carry/whl and .carry/bench_torch.py: `bench/gpu/land-mma.sh .carry/x/nsa.xz`.
set -u
R=$(pwd)
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt
bin=/tmp/nsa; xz -dc "$1" > $bin && chmod +x $bin
for p in f32 bf16; do
  timeout ${PARITY_S:-150} $bin bench-kernels --backend cuda --precision $p --check-len 2049 --lengths 64 --iters 1 \
    2>&1 | grep -v '^|' | tee -a $OUT/parity.txt
done
[ "${TIME_S:-120}" -gt 0 ] && timeout ${TIME_S:-120} $bin bench-kernels --backend cuda --precision bf16 --check-len 0 \
  --lengths 65536 --iters 5 2>&1 | tee $OUT/time.txt
mkdir -p /tmp/kp && cd /tmp/kp
printf '[profiling.logger]\nlevel = "basic"\nfile = "/tmp/kp.log"\n' > cubecl.toml
timeout ${PROFILE_S:-90} $bin bench-kernels --backend cuda --precision bf16 --check-len 0 --lengths 65536 --iters 10 \
  --shapes ${PROFILE_SHAPES:-production} > /dev/null 2>&1
python3 $R/bench/gpu/kernel_shares.py /tmp/kp.log | tee $OUT/kernels.txt
cd $R
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl
PYTHONPATH=/tmp/site timeout ${ANCHOR_S:-120} python3 bench/gpu/anchor_attn.py ${ANCHORS:-1,65536,12,2,64 1,65536,64,4,128} \
  2>&1 | tee $OUT/anchor-attn.txt

#!/usr/bin/env bash
# Parity of the fused kernels against the reference on the device, at lengths whose block lists
# have padded rows on CUDA (T = 333: 6 blocks, T = 2049: 33 blocks): f32 and bf16, one or more
# builds. From the repository root: `bench/gpu/parity.sh .carry/nsa.xz [.carry/other/nsa.xz ...]`.
# LENGTHS (default 64) are timed after the bf16 check.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
for packed in "$@"; do
  name=$(echo "$packed" | tr / _ | sed 's/^\.carry_//; s/\.xz$//')
  bin=/tmp/$name; xz -dc "$packed" > $bin && chmod +x $bin
  echo "== $packed" | tee -a $OUT/parity.txt
  timeout ${F32_S:-150} $bin bench-kernels --backend cuda --precision f32 --check-len 333 --lengths 64 --iters 1 \
    2>&1 | grep -v '^|' | tee -a $OUT/parity.txt
  timeout ${BF16_S:-240} $bin bench-kernels --backend cuda --precision bf16 --check-len 2049 \
    --lengths ${LENGTHS:-64} --iters 3 2>&1 | tee -a $OUT/parity.txt
done

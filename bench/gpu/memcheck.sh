#!/usr/bin/env bash
# compute-sanitizer memcheck over a small sweep of the fused kernels (all four bench shapes, both key sets,
# forward and backward, ragged lengths). From the repository root:
# `bash bench/gpu/memcheck.sh .carry/x/nsa.xz` (default `.carry/nsa.xz`).
set -u
bin=/tmp/nsa-memcheck; xz -dc "${1:-.carry/nsa.xz}" > $bin && chmod +x $bin
timeout ${MEMCHECK_S:-400} compute-sanitizer --tool memcheck --error-exitcode 9 \
  $bin bench-kernels --backend cuda --precision bf16 --iters 1 --check-len 0 --lengths 1000,2049 --shapes production,paper,wide,mha \
  2>&1 | tee $OUT/memcheck.txt
echo "memcheck exit ${PIPESTATUS[0]}" | tee -a $OUT/memcheck.txt

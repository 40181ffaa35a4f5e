#!/usr/bin/env bash
# compute-sanitizer's memcheck over a small sweep of the fused kernels on CUDA: every plan at T = 300
# (the parity check forces each), then the chosen plans over all four shapes
# of `nsa-bench kernels`, both key sets, forward and backward, at ragged lengths (1000, 2049:
# blocks with padded rows). Needs CUDA's compute-sanitizer on the PATH and a CUDA build of
# `nsa-bench` (`cargo build --release -p nsa-bench --features cuda`, then target/release/nsa-bench).
# Usage: bash bench/memcheck.sh BINARY OUTDIR   (OUTDIR gets memcheck.txt and kernels.json)
set -u
if [ $# -ne 2 ]; then
  echo "usage: $0 BINARY OUTDIR" >&2
  exit 2
fi
bin=$1 out=$2
mkdir -p "$out"
compute-sanitizer --tool memcheck --error-exitcode 9 \
  "$bin" kernels --backend cuda --precision bf16 --iters 1 --check-len 300 --lengths 1000,2049 \
  --shapes production,paper,wide,mha --out "$out" 2>&1 | tee "$out/memcheck.txt"
status=${PIPESTATUS[0]}
echo "memcheck exit $status" | tee -a "$out/memcheck.txt"
exit "$status"

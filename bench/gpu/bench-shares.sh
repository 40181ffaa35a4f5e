#!/usr/bin/env bash
# Per-kernel time shares of `nsa bench-kernels` at 64k (CubeCL's profiling log: every kernel
# timed with a sync, so the totals are inflated; the shares are what matter), one log per shape.
# From the repository root: `bash bench/gpu/bench-shares.sh .carry/x/nsa.xz [shapes]`.
set -u
bin=/tmp/nsa; [ -x $bin ] || { xz -dc "$1" > $bin && chmod +x $bin; }
R=$(pwd)
for shape in ${2:-production paper}; do
  mkdir -p /tmp/bs-$shape
  printf '[profiling.logger]\nlevel = "basic"\nfile = "/tmp/bs-%s.log"\n' $shape > /tmp/bs-$shape/cubecl.toml
  (cd /tmp/bs-$shape && timeout 200 $bin bench-kernels --backend cuda --precision bf16 --check-len 0 \
    --lengths 65536 --iters 2 --shapes $shape 2>&1 | grep '^|')
  python3 $R/bench/gpu/kernel_shares.py /tmp/bs-$shape.log all | tee $OUT/shares-$shape.txt
done

#!/usr/bin/env bash
# What bounds each production-shape kernel at 64k (Nsight Compute: registers, occupancy and its
# limits, throughput, the warp-stall hints), one launch each. From the repository root:
# `bash bench/gpu/kernel-limits.sh .carry/x/nsa.xz`.
set -u
bin=/tmp/nsa-limits; xz -dc "$1" > $bin && chmod +x $bin
# name regex, launches to skip (the window's key kernel comes before the selection's)
for k in "window_forward_flash 0" "attention_key_flash 0" "selection_partials_flash 0" "attention_key_flash 2" \
         "merge_selection_partials 0"; do
  set -- $k
  echo "== $1 (skip $2)"
  timeout ${NCU_S:-90} ncu --kernel-name-base function -k regex:$1 --launch-skip $2 --launch-count 1 \
    --section LaunchStats --section Occupancy --section WarpStateStats --section SpeedOfLight \
    $bin bench-kernels --backend cuda --precision bf16 --check-len 0 --lengths 65536 --iters 1 --shapes production 2>&1 |
    grep -E "Duration|Registers Per|Block Limit (Reg|Shared)|Theoretical Occ|Achieved Occ|Compute \(SM\) Thr|Memory Thr|Warp Cycles Per Issued|stalled|Dynamic Shared|Static Shared" |
    sed 's/  */ /g' | cut -c1-300
done

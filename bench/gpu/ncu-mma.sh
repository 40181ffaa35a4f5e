#!/usr/bin/env bash
# Nsight Compute on the tensor-core kernels of one build (one launch each, production shape at
# 64k, bf16): throughput, memory and warp-stall sections; KERNELS (an ncu --kernel-name filter)
# picks them, SKIP how many matching launches to pass over first, LAUNCHES how many are profiled. `bench/gpu/ncu-mma.sh .carry/x/nsa.xz`.
set -u
bin=/tmp/nsa; [ -x $bin ] || { xz -dc "$1" > $bin && chmod +x $bin; }
timeout ${NCU_S:-150} ncu --kernel-name-base function --kernel-name "${KERNELS:-regex:.*[Mm]ma.*}" --launch-skip ${SKIP:-0} --launch-count ${LAUNCHES:-3} \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
  --section LaunchStats $bin bench-kernels --backend cuda --precision bf16 --check-len 0 --lengths 65536 --iters 1 \
  --shapes production > $OUT/ncu.txt 2>&1
tail -c 20000 $OUT/ncu.txt | grep -v "^==PROF==" | head -400

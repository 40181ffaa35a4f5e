#!/usr/bin/env bash
# The register-resident window kernels of one build on the device: the quick check (parity of
# all four shapes, 64k timings, anchors), each kernel's own time, and Nsight Compute's warp
# stall reasons and pipe utilisation for one launch of each. `bash bench/gpu/flash-profile.sh .carry/x/nsa.xz`.
set -u
bash bench/gpu/quick-check.sh "$1" 2>&1 | grep -v "^# case" | tail -30
NCU_S=150 bash bench/gpu/kernel-times.sh "$1" production 2>&1 | grep -i "flash\|delta" | head -4
timeout 200 ncu --kernel-name-base function --kernel-name "regex:.*flash.*" --launch-count 3 \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,launch__registers_per_thread,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active" \
  /tmp/nsa bench-kernels --backend cuda --precision bf16 --check-len 0 --lengths 65536 --iters 1 --shapes production > $OUT/ncu-stalls.txt 2>&1
grep -E "flash|registers|hmma|pipe_xu|inst_executed.sum|warps_active" $OUT/ncu-stalls.txt | head -30
grep -E "stalled" $OUT/ncu-stalls.txt | awk '$NF+0 > 0.3' | head -60

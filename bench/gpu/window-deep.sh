#!/usr/bin/env bash
# The window kernels of one build, in depth: the CUDA source CubeCL generates for every kernel
# (CUBECL_DEBUG_LOG, a 16k run), and Nsight Compute's full set for one 64k launch each of the
# window forward and the window's key kernel, exported as per-SASS-instruction stall samples and
# section summaries. `bash bench/gpu/window-deep.sh .carry/x/nsa.xz`.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
bin=/tmp/nsa; [ -x $bin ] || { xz -dc "$1" > $bin && chmod +x $bin; }
CUBECL_DEBUG_LOG=$OUT/cubecl.log timeout 120 $bin bench-kernels --backend cuda --precision bf16 \
  --check-len 0 --lengths 16384 --iters 1 --shapes production > /dev/null 2>&1
xz -T4 -6 $OUT/cubecl.log
for k in window_forward_flash attention_key_flash; do
  timeout ${NCU_S:-150} ncu --set full --import-source no --kernel-name-base function \
    --kernel-name "regex:$k" --launch-count 1 -o $OUT/$k \
    $bin bench-kernels --backend cuda --precision bf16 --check-len 0 --lengths 65536 --iters 1 \
    --shapes production > /dev/null 2>&1
  ncu -i $OUT/$k.ncu-rep --page details > $OUT/$k-details.txt 2>&1
  ncu -i $OUT/$k.ncu-rep --page source --csv --print-source sass > $OUT/$k-sass.csv 2>&1
  xz -T4 -6 $OUT/$k-sass.csv
  rm -f $OUT/$k.ncu-rep
  grep -E "Duration|Registers|Theoretical Occ|Achieved Occ|Issue Slots Busy|Executed Ipc|No Eligible|Warp Cycles Per Issued|One or More" $OUT/$k-details.txt | head -20
done
ls -la $OUT

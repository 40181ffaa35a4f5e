#!/usr/bin/env bash
# Registers, shared memory and occupancy limits of the register-resident kernels of already
# unpacked builds (one 16k production run each): `bash bench/gpu/kernel-limits-of.sh /tmp/nsa-1 /tmp/nsa-2`.
set -u
for b in "$@"; do
  echo "== $b"
  timeout 60 ncu --kernel-name-base function --kernel-name "regex:flash" --launch-count 4 \
    --metrics launch__registers_per_thread,launch__shared_mem_per_block_dynamic,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,launch__block_size \
    $b bench-kernels --backend cuda --precision bf16 --check-len 0 --lengths 16384 --iters 1 --shapes production 2>&1 \
    | grep -E "^  [a-z_]+flash|launch__" | awk '{$1=$1; print}' | paste -sd' ' | sed 's/ \([a-z_]*flash\)/\n\1/g'
done

#!/usr/bin/env bash
# The sweep timed both ways (synced median and pipelined mean, `nsa bench-kernels`' last three
# columns), with bf16 parity first and the production anchors from the same call. From the
# repository root, with .carry/whl and .carry/bench_torch.py:
# `bash bench/gpu/pipelined-sweep.sh .carry/x/nsa.xz`. SHAPES (default production) and
# LENGTHS (default every length) choose the sweep; PAPER=1 adds the paper shape at 64k.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt
bin=/tmp/nsa-sweep; xz -dc "$1" > $bin && chmod +x $bin
timeout 120 $bin bench-kernels --backend cuda --precision bf16 --check-len 777 --lengths 64 --iters 1 \
  --shapes production,mha 2>&1 | grep -v '^|' | tee $OUT/parity.txt
timeout ${SWEEP_S:-240} $bin bench-kernels --backend cuda --precision bf16 --check-len 0 --iters ${ITERS:-10} \
  --shapes ${SHAPES:-production} ${LENGTHS:+--lengths $LENGTHS} 2>&1 | tee $OUT/sweep.txt
if [ -n "${PAPER:-}" ]; then
  timeout 150 $bin bench-kernels --backend cuda --precision bf16 --check-len 0 --iters 5 --shapes paper \
    --lengths 65536 2>&1 | tee $OUT/sweep-paper.txt
fi
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl
PYTHONPATH=/tmp/site timeout ${ANCHOR_S:-120} python3 bench/gpu/anchor_attn.py 1,2048,12,2,64 1,8192,12,2,64 \
  1,16384,12,2,64 1,32768,12,2,64 1,65536,12,2,64 2>&1 | tee $OUT/anchor-production.txt
if [ -n "${NCU:-}" ]; then
  # Every kernel's own time at the device's real clocks (`--clock-control none`), production 64k,
  # in launch order: window then selected, each forward x4 then forward+backward x4 (warm-up and
  # timed run of the synced and of the pipelined timing).
  timeout ${NCU_S:-150} ncu --clock-control none --kernel-name-base function --metrics gpu__time_duration.sum --csv \
    $bin bench-kernels --backend cuda --precision bf16 --check-len 0 --lengths 65536 --iters 1 \
    --shapes production > $OUT/times-production.csv 2>/dev/null
  python3 - $OUT/times-production.csv <<'PY' | tee $OUT/times-production.txt
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, rows = rows[0], rows[1:]
name, unit, value = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
scale = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3, "s": 1e3}
for i, r in enumerate(rows):
    ms = float(r[value].replace(",", "")) * scale[r[unit]]
    print(f"{i:4d} {ms:9.4f}  {r[name][:80]}")
PY
fi

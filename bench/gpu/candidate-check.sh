#!/usr/bin/env bash
# Kernel candidates against a baseline in one device call: the last candidate's bf16 parity on
# all four shapes, its memcheck over production and mha at T = 1000 (both key sets, fwd and
# bwd), then every build at 64k alternated over two rounds (SHAPES, default production), and
# every kernel's own time for each build (ncu at real clocks, production 64k, one run each).
# LENGTHS (default 65536, comma-separated) sets the A/B's lengths.
# From the repository root:
# `bash bench/gpu/candidate-check.sh .carry/base/nsa.xz .carry/x/nsa.xz [.carry/y/nsa.xz ...]`.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt
builds=()
for i in $(seq 1 $#); do
  bin=/tmp/nsa-$i; xz -dc "${!i}" > $bin && chmod +x $bin; builds+=($bin)
done
cand=${builds[-1]}
for s in "2049 production" "777 paper" "777 wide,mha"; do
  set -- $s
  timeout 150 $cand bench-kernels --backend cuda --precision bf16 --check-len $1 --lengths 64 --iters 1 --shapes $2 2>&1 \
    | grep -v '^|' | tee -a $OUT/parity.txt
done
timeout ${MEMCHECK_S:-130} compute-sanitizer --tool memcheck --error-exitcode 9 \
  $cand bench-kernels --backend cuda --precision bf16 --iters 1 --check-len 0 --lengths 1000 --shapes production,mha \
  > $OUT/memcheck.txt 2>&1
echo "memcheck exit $?" | tee -a $OUT/memcheck.txt; grep "ERROR SUMMARY" $OUT/memcheck.txt
for round in 1 2; do
  for b in ${builds[@]}; do
    echo "== $b (round $round)" | tee -a $OUT/ab.txt
    timeout 120 $b bench-kernels --backend cuda --precision bf16 --check-len 0 --lengths ${LENGTHS:-65536} --iters 10 \
      --shapes ${SHAPES:-production} 2>&1 | grep '^| [a-z]' | tee -a $OUT/ab.txt
  done
done
for b in ${builds[@]}; do
  timeout 100 ncu --clock-control none --kernel-name-base function --metrics gpu__time_duration.sum --csv \
    $b bench-kernels --backend cuda --precision bf16 --check-len 0 --lengths 65536 --iters 1 --shapes production \
    2>/dev/null > /tmp/t.csv
  echo "== $b: mean ms per kernel (ncu, production 64k)" | tee -a $OUT/kernels.txt
  python3 - /tmp/t.csv <<'PY' | tee -a $OUT/kernels.txt
import collections, csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, rows = rows[0], rows[1:]
name, unit, value = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
scale = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3, "s": 1e3}
# The bench times the window first, then the selection (whose first kernel builds its index).
times, branch = collections.defaultdict(list), "window"
for r in rows:
    if "count_selections" in r[name]:
        branch = "selected"
    times[(branch, r[name][:60])].append(float(r[value].replace(",", "")) * scale[r[unit]])
for (branch, k), v in times.items():
    if max(v) > 0.05:
        print(f"{branch:8s} {k:60s} n={len(v):3d} mean {sum(v)/len(v):.4f} min {min(v):.4f} max {max(v):.4f}")
PY
done

#!/usr/bin/env bash
# Every kernel's own GPU time (Nsight Compute's gpu__time_duration, one launch at a time, so
# no overlap and no launch gaps) over one `nsa bench-kernels` iteration per shape: the
# per-kernel split the profiling log cannot give. `bash bench/gpu/kernel-times.sh .carry/x/nsa.xz [shapes]`.
# LENGTH (default 65536) and MIN_MS (default 0.05, the smallest launch listed) change the run;
# CLOCKS (ncu's --clock-control, default base: locked clocks) `none` times at the real clocks.
set -u
bin=/tmp/nsa; [ -x $bin ] || { xz -dc "$1" > $bin && chmod +x $bin; }
for shape in ${2:-production paper}; do
  timeout ${NCU_S:-200} ncu --clock-control ${CLOCKS:-base} --kernel-name-base function --metrics gpu__time_duration.sum --csv \
    $bin bench-kernels --backend cuda --precision bf16 --check-len 0 --lengths ${LENGTH:-65536} --iters 1 \
    --shapes $shape > $OUT/times-$shape.csv 2>/dev/null
  echo "== $shape: ms per launch, in launch order at T = ${LENGTH:-65536} (kernels over ${MIN_MS:-0.05} ms)"
  MIN_MS=${MIN_MS:-0.05} python3 - $OUT/times-$shape.csv <<'PY'
import csv, os, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, rows = rows[0], rows[1:]
name, unit, value = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
scale = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3, "s": 1e3}
for r in rows:
    ms = float(r[value].replace(",", "")) * scale[r[unit]]
    if ms > float(os.environ["MIN_MS"]):
        print(f"{ms:9.3f}  {r[name][:90]}")
PY
done

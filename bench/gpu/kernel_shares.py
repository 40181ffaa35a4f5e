"""Sums CubeCL profiling-log kernel times by kind: the second half of the log (a training run's
steady steps), or all of it with a second argument `all` (a benchmark's log)."""
import re, sys, collections
lines = [l for l in open(sys.argv[1], errors="replace") if l.startswith("|")]
if sys.argv[2:] != ["all"]:
    lines = lines[len(lines) // 2:]
unit = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1e3}
by_name, by_kind = collections.Counter(), collections.Counter()
for l in lines:
    m = re.match(r"\|\s*([\d.]+)(ns|µs|us|ms|s)\s*\|\s*(.*)", l)
    if not m:
        continue
    ms = float(m.group(1)) * unit[m.group(2)]
    name = m.group(3).strip()
    short = re.sub(r"<.*", "", name)[:110]
    by_name[short] += ms
    n = name.lower()
    kind = ("matmul" if "matmul" in n else "reduce" if "reduce" in n else
            "elementwise (fused)" if "elemwise" in n or "fuse" in n else "other")
    by_kind[kind] += ms
total = sum(by_kind.values())
print(f"kernels timed: {len(lines)}, total {total:.1f} ms")
for k, v in by_kind.most_common():
    print(f"{k:24s} {v:10.1f} ms {100 * v / total:5.1f}%")
print("top kernels:")
for k, v in by_name.most_common(20):
    print(f"{v:10.1f} ms {100 * v / total:5.1f}%  {k}")

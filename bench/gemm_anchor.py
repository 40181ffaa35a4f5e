"""torch.matmul on the linear layers' products of the 125M model, for `nsa-bench gemm`'s
figures: forward `x w`, input gradient `dY w^T`, weight gradient `x^T dY` for each layer shape,
bf16, timed with triton's do_bench-like CUDA-event loop (median). One line per case:
  MxKxN TT  torch TFLOP/s
Usage: python3 bench/gemm_anchor.py [--rows 32768]
"""
import argparse

import torch

LAYERS = [(768, 768), (768, 128), (768, 3072), (3072, 768), (768, 36), (768, 256)]


def bench(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=32768)
    a = p.parse_args()
    dt = torch.bfloat16
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for d_in, d_out in LAYERS:
        rows = a.rows
        cases = [(rows, d_in, d_out, False, False), (rows, d_out, d_in, False, True), (d_in, rows, d_out, True, False)]
        for m, k, n, ta, tb in cases:
            x = torch.randn((k, m) if ta else (m, k), device="cuda", dtype=dt)
            w = torch.randn((n, k) if tb else (k, n), device="cuda", dtype=dt)
            f = lambda: torch.matmul(x.t() if ta else x, w.t() if tb else w)
            ms = bench(f)
            t = lambda b: "T" if b else "N"
            print(f"{m}x{k}x{n} {t(ta)}{t(tb)}  torch {2 * m * k * n / ms / 1e9:7.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()

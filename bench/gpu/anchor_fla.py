"""fla-core's parallel_nsa alone (the case of bench_torch.attn_cases, unchanged), in a fresh
process: after the dense SDPA cases of the same shape, PyTorch's cached memory leaves fla's
Triton backward out of memory at T = 64k. Usage: anchor_fla.py B,T,HQ,H,D ..."""
import sys

import torch

sys.path.insert(0, ".carry")
import bench_torch  # noqa: E402
from fla.ops.nsa import parallel_nsa  # noqa: E402

print("B,T,HQ,H,D,case,ms", flush=True)
for arg in sys.argv[1:]:
    B, T, HQ, H, D = (int(x) for x in arg.split(","))
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(B, T, HQ, D, device=dev, dtype=dt, requires_grad=True)
    k = torch.randn(B, T, H, D, device=dev, dtype=dt, requires_grad=True)
    v = torch.randn(B, T, H, D, device=dev, dtype=dt, requires_grad=True)
    do = torch.randn(B, T, HQ, D, device=dev, dtype=dt)
    g_cmp = torch.rand(B, T, HQ, device=dev, dtype=dt, requires_grad=True)
    g_slc = torch.rand(B, T, HQ, device=dev, dtype=dt, requires_grad=True)

    def nsa():
        return parallel_nsa(q, k, v, g_cmp=g_cmp, g_slc=g_slc, block_counts=16, block_size=64, window_size=0)

    for name, fn in [("fla_fwd", nsa), ("fla_fb", lambda: nsa().backward(do))]:
        print(f"{arg},{name},{bench_torch.bench(fn):.3f}", flush=True)

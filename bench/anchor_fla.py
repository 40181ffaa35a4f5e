"""fla-core's parallel_nsa alone (`bench/anchor_attn.py`'s fla case, unchanged), in a fresh
process: after the dense SDPA cases of the same shape, PyTorch's cached memory leaves fla's
Triton backward out of memory at T = 64k. Needs a CUDA GPU, torch, triton and fla-core.
Usage: python3 bench/anchor_fla.py [--out FILE.csv] B,T,HQ,H,D ...   (e.g. 1,65536,64,4,128)
"""
import argparse

import torch
from fla.ops.nsa import parallel_nsa

from anchor_attn import DEV, DT, bench


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shapes", nargs="+", help="B,T,HQ,H,D")
    p.add_argument("--out", help="also write the CSV rows here")
    a = p.parse_args()
    rows = ["B,T,HQ,H,D,case,ms"]
    print(rows[0], flush=True)
    for arg in a.shapes:
        B, T, HQ, H, D = (int(x) for x in arg.split(","))
        q = torch.randn(B, T, HQ, D, device=DEV, dtype=DT, requires_grad=True)
        k = torch.randn(B, T, H, D, device=DEV, dtype=DT, requires_grad=True)
        v = torch.randn(B, T, H, D, device=DEV, dtype=DT, requires_grad=True)
        do = torch.randn(B, T, HQ, D, device=DEV, dtype=DT)
        g_cmp = torch.rand(B, T, HQ, device=DEV, dtype=DT, requires_grad=True)
        g_slc = torch.rand(B, T, HQ, device=DEV, dtype=DT, requires_grad=True)

        def nsa():
            return parallel_nsa(q, k, v, g_cmp=g_cmp, g_slc=g_slc, block_counts=16, block_size=64, window_size=0)

        for name, fn in [("fla_fwd", nsa), ("fla_fb", lambda: nsa().backward(do))]:
            rows.append(f"{arg},{name},{bench(fn):.3f}")
            print(rows[-1], flush=True)
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()

"""PyTorch's attention at `nsa-bench kernels`' shapes, the anchors its figures are compared with:
median ms (triton.testing.do_bench) of
  dense_fwd, dense_fb: SDPA causal attention (the backend torch picks), GQA
  swa_fwd, swa_fb:     flex_attention with a causal sliding window of 512 (our window branch)
  fla_fwd, fla_fb:     fla-core's parallel_nsa (block counts 16, block size 64, window 0), where
                       the group H_q / H_kv is a power of two of at least 16 (fla's kernels need it)
bf16, backward seeded with a random dO. Needs a CUDA GPU, torch and triton; fla-core for fla.
At T = 64k run fla apart (`bench/anchor_fla.py`): after the dense cases, PyTorch's cached memory
can leave its backward out of memory.
Usage: python3 bench/anchor_attn.py [--out FILE.csv] B,T,HQ,H,D ...
  e.g. 1,65536,12,2,64 (the production shape) 1,65536,64,4,128 (the paper's)
"""
import argparse
import time

import torch
import torch.nn.functional as F
import triton

DEV, DT = "cuda", torch.bfloat16
WINDOW = 512


def bench(fn):
    """Median ms of `fn`, CUDA events around each call, no sync between calls."""
    return triton.testing.do_bench(fn, warmup=30, rep=200, return_mode="median")


def attn_cases(B, T, HQ, H, D):
    q = torch.randn(B, T, HQ, D, device=DEV, dtype=DT, requires_grad=True)
    k = torch.randn(B, T, H, D, device=DEV, dtype=DT, requires_grad=True)
    v = torch.randn(B, T, H, D, device=DEV, dtype=DT, requires_grad=True)
    do = torch.randn(B, T, HQ, D, device=DEV, dtype=DT)
    qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_(True) for x in (q, k, v))
    dot = do.transpose(1, 2).contiguous()

    def dense():
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=HQ != H)

    res = {"dense_fwd": bench(dense), "dense_fb": bench(lambda: dense().backward(dot))}
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def swa(b, h, qi, ki):
            return (qi >= ki) & (qi - ki < WINDOW)

        mask = create_block_mask(swa, B=None, H=None, Q_LEN=T, KV_LEN=T, device=DEV)
        fx = torch.compile(flex_attention, dynamic=False)

        def flex():
            return fx(qt, kt, vt, block_mask=mask, enable_gqa=HQ != H)

        res["swa_fwd"] = bench(flex)
        res["swa_fb"] = bench(lambda: flex().backward(dot))
    except Exception as e:  # noqa: BLE001 (an anchor that cannot run is reported, not fatal)
        print("# flex_attention failed:", repr(e)[:300], flush=True)
    g = HQ // H
    if g >= 16 and (g & (g - 1)) == 0:
        try:
            from fla.ops.nsa import parallel_nsa

            g_cmp = torch.rand(B, T, HQ, device=DEV, dtype=DT, requires_grad=True)
            g_slc = torch.rand(B, T, HQ, device=DEV, dtype=DT, requires_grad=True)

            def nsa():
                return parallel_nsa(q, k, v, g_cmp=g_cmp, g_slc=g_slc, block_counts=16, block_size=64, window_size=0)

            res["fla_fwd"] = bench(nsa)
            res["fla_fb"] = bench(lambda: nsa().backward(do))
        except Exception as e:  # noqa: BLE001
            print("# fla failed:", repr(e)[:400], flush=True)
    return res


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shapes", nargs="+", help="B,T,HQ,H,D")
    p.add_argument("--out", help="also write the CSV rows here")
    a = p.parse_args()
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    rows = ["B,T,HQ,H,D,case,ms"]
    print(rows[0], flush=True)
    for arg in a.shapes:
        case = tuple(int(x) for x in arg.split(","))
        t0 = time.time()
        for name, ms in attn_cases(*case).items():
            rows.append(",".join(str(x) for x in case) + f",{name},{ms:.3f}")
            print(rows[-1], flush=True)
        print(f"# case took {time.time() - t0:.0f}s", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()

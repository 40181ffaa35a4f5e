"""The training anchor: PyTorch's dense model of the 125M NSA model's shape, trained as a user
would train it (bf16 autocast, fused AdamW, global-norm clip), for `cargo xtask bench train
--anchor`.

The model is `shared/anchors/bench_torch.py train`'s (dim 768, 12 layers, 12 query heads, 2 KV
heads, head dim 64, byte vocabulary, SiLU MLP 4x, RoPE, SDPA causal attention), so its figures
match that script's. Prints one JSON object per configuration on stdout:
  {"anchor": "torch-dense", "compiled": bool, "batch": B, "seq_len": T, "tokens_per_s": x,
   "median_step_ms": m, "worst_step_ms": w, "peak_gib": g}

Usage: python3 bench/train_anchor.py --batch 16 --seq-len 2048 [--steps 20] [--warmup 5] [--compile both|yes|no]
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(s, dim, nh, nkv, hd, mlp_ratio):
        super().__init__()
        s.nh, s.nkv, s.hd = nh, nkv, hd
        s.n1 = torch.nn.RMSNorm(dim)
        s.n2 = torch.nn.RMSNorm(dim)
        s.wq = torch.nn.Linear(dim, nh * hd, bias=False)
        s.wkv = torch.nn.Linear(dim, 2 * nkv * hd, bias=False)
        s.wo = torch.nn.Linear(nh * hd, dim, bias=False)
        s.f1 = torch.nn.Linear(dim, mlp_ratio * dim, bias=False)
        s.f2 = torch.nn.Linear(mlp_ratio * dim, dim, bias=False)

    def forward(s, x, cos, sin):
        b, t, _ = x.shape
        h = s.n1(x)
        q = s.wq(h).view(b, t, s.nh, s.hd)
        k, v = s.wkv(h).view(b, t, 2, s.nkv, s.hd).unbind(2)

        def rope(u):
            u1, u2 = u[..., : s.hd // 2], u[..., s.hd // 2:]
            return torch.cat([u1 * cos - u2 * sin, u2 * cos + u1 * sin], -1)

        q, k = rope(q), rope(k)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True, enable_gqa=True)
        x = x + s.wo(o.transpose(1, 2).reshape(b, t, -1))
        return x + s.f2(F.silu(s.f1(s.n2(x))))


class LM(torch.nn.Module):
    def __init__(s, layers=12, dim=768, nh=12, nkv=2, hd=64, mlp_ratio=4, vocab=256):
        super().__init__()
        s.hd = hd
        s.emb = torch.nn.Embedding(vocab, dim)
        s.blocks = torch.nn.ModuleList(Block(dim, nh, nkv, hd, mlp_ratio) for _ in range(layers))
        s.norm = torch.nn.RMSNorm(dim)
        s.head = torch.nn.Linear(dim, vocab, bias=False)

    def forward(s, x):
        t = x.shape[1]
        half = s.hd // 2
        inv = 1.0 / (10000 ** (torch.arange(0, half, device=x.device) / half))
        ang = torch.arange(t, device=x.device)[:, None] * inv[None]
        cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
        h = s.emb(x)
        for b in s.blocks:
            h = b(h, cos, sin)
        return s.head(s.norm(h))


def run(batch, seq_len, steps, warmup, compiled):
    torch.manual_seed(0)
    dev = "cuda"
    model = LM().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-4, fused=True)
    f = torch.compile(model) if compiled else model
    x = torch.randint(0, 256, (batch, seq_len + 1), device=dev)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = f(x[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    torch.cuda.reset_peak_memory_stats()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    # Throughput as bench_torch.py takes it: steps queued back to back, one sync at the end.
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    total = time.perf_counter() - start
    # Per-step latencies from a second, synced pass.
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    times.sort()
    out = {
        "anchor": "torch-dense",
        "compiled": compiled,
        "batch": batch,
        "seq_len": seq_len,
        "params": sum(p.numel() for p in model.parameters()),
        "tokens_per_s": steps * batch * seq_len / total,
        "median_step_ms": 1e3 * times[len(times) // 2],
        "worst_step_ms": 1e3 * times[-1],
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
    }
    print(json.dumps(out), flush=True)
    del model, opt, f
    torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--compile", choices=["both", "yes", "no"], default="both")
    a = p.parse_args()
    modes = {"both": [False, True], "yes": [True], "no": [False]}[a.compile]
    for compiled in modes:
        run(a.batch, a.seq_len, a.steps, max(a.warmup, 1), compiled)


if __name__ == "__main__":
    main()

"""The decode anchor: PyTorch's dense model of the 125M NSA model's shape (the training anchor's,
`train_anchor.py`), generating with a static KV cache and SDPA in eager mode, for
`cargo xtask bench decode --anchor`.

Per (context, batch): a prefill of `context` random tokens per sequence (SDPA causal, timed
apart), then `tokens` decode steps, each one token per sequence against the cache
(`[B, H_kv, L, d]`, preallocated; a step attends the whole cache with the positions after its
token masked, so its shapes never change), logits copied to the host as a sampler would. Prints one JSON object per configuration on stdout:
  {"anchor": "torch-dense-decode", "context": T, "batch": B, "prefill_s": p,
   "token_ms": median step, "tokens_per_s": B / mean step, "peak_gib": g}

With `--profile`, also "step_kernels_us" (the device time of a step's kernels) and
"attention_us_per_layer" (of its SDPA kernels, per layer), from torch.profiler over 4 more steps.

Usage: python3 bench/decode_anchor.py --contexts 2048,16384,65536 --batches 1,16 [--tokens 64] [--warmup 8] [--profile]
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from train_anchor import LM


def rope_tables(hd, length, device):
    half = hd // 2
    inv = 1.0 / (10000 ** (torch.arange(0, half, device=device) / half))
    ang = torch.arange(length, device=device)[:, None] * inv[None]
    return ang.cos(), ang.sin()


def rope(u, cos, sin):
    half = u.shape[-1] // 2
    u1, u2 = u[..., :half], u[..., half:]
    return torch.cat([u1 * cos - u2 * sin, u2 * cos + u1 * sin], -1)


def attend_block(blk, x, cache_k, cache_v, start, cos, sin):
    """`x: [B, T, dim]` at positions `start..start+T`, writing its K/V into the cache."""
    b, t, _ = x.shape
    h = blk.n1(x)
    q = blk.wq(h).view(b, t, blk.nh, blk.hd)
    k, v = blk.wkv(h).view(b, t, 2, blk.nkv, blk.hd).unbind(2)
    c, s = cos[start:start + t][None, :, None, :], sin[start:start + t][None, :, None, :]
    q, k = rope(q, c, s), rope(k, c, s)
    cache_k[:, :, start:start + t] = k.transpose(1, 2)
    cache_v[:, :, start:start + t] = v.transpose(1, 2)
    if t > 1:  # the prefill: causal over the prompt
        keys, values = cache_k[:, :, :start + t], cache_v[:, :, :start + t]
        o = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, is_causal=True, enable_gqa=True)
    else:  # a decode step: the whole static cache, positions past the token masked, so every
        # step has the same shapes (a growing slice makes cuDNN plan each new length: ~40 ms)
        seen = (torch.arange(cache_k.shape[2], device=x.device) <= start)[None, None, None, :]
        o = F.scaled_dot_product_attention(q.transpose(1, 2), cache_k, cache_v, attn_mask=seen, enable_gqa=True)
    x = x + blk.wo(o.transpose(1, 2).reshape(b, t, -1))
    return x + blk.f2(F.silu(blk.f1(blk.n2(x))))


@torch.no_grad()
def forward(model, tokens, caches, start, cos, sin):
    h = model.emb(tokens)
    for blk, (ck, cv) in zip(model.blocks, caches):
        h = attend_block(blk, h, ck, cv, start, cos, sin)
    return model.head(model.norm(h[:, -1]))


def run(context, batch, tokens, warmup, profile=False):
    torch.manual_seed(0)
    dev = "cuda"
    model = LM().to(dev).to(torch.bfloat16).eval()
    length = context + warmup + tokens + (4 if profile else 0)
    cos, sin = rope_tables(model.hd, length, dev)
    cos, sin = cos.to(torch.bfloat16), sin.to(torch.bfloat16)
    blk = model.blocks[0]
    caches = [(torch.zeros(batch, blk.nkv, length, blk.hd, device=dev, dtype=torch.bfloat16),
               torch.zeros(batch, blk.nkv, length, blk.hd, device=dev, dtype=torch.bfloat16)) for _ in model.blocks]
    torch.cuda.reset_peak_memory_stats()
    prompt = torch.randint(0, 256, (batch, context), device=dev)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    logits = forward(model, prompt, caches, 0, cos, sin)
    next_token = logits.float().cpu().argmax(-1)
    prefill_s = time.perf_counter() - t0
    times = []
    for step in range(warmup + tokens):
        t0 = time.perf_counter()
        logits = forward(model, next_token.to(dev)[:, None], caches, context + step, cos, sin)
        next_token = logits.float().cpu().argmax(-1)
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    result = {
        "anchor": "torch-dense-decode",
        "context": context,
        "batch": batch,
        "prefill_s": prefill_s,
        "token_ms": statistics.median(times) * 1e3,
        "tokens_per_s": batch / statistics.mean(times),
        "peak_gib": torch.cuda.max_memory_reserved() / 2**30,
    }
    if profile:
        result.update(kernel_times(model, next_token, caches, context + warmup + tokens, cos, sin))
    return result


def kernel_times(model, next_token, caches, start, cos, sin, steps=4):
    """Device time of a step's kernels (torch.profiler, CUPTI), in total and SDPA's alone, in
    microseconds per step and per layer: the attention part of the step beside ours."""
    from torch.profiler import profile, ProfilerActivity
    if start + steps > caches[0][0].shape[2]:
        return {}
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for step in range(steps):
            logits = forward(model, next_token.to("cuda")[:, None], caches, start + step, cos, sin)
            next_token = logits.float().cpu().argmax(-1)
        torch.cuda.synchronize()
    total = attention = 0.0
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = event.device_time if hasattr(event, "device_time") else event.cuda_time
        total += us
        name = event.name.lower()
        if any(k in name for k in ("fmha", "flash", "attention", "attn")):
            attention += us
    layers = len(model.blocks)
    return {"step_kernels_us": total / steps, "attention_us_per_layer": attention / steps / layers}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--contexts", default="2048,16384,65536")
    p.add_argument("--batches", default="1,16")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--profile", action="store_true",
                   help="also the device time of a step's kernels and of its attention (torch.profiler)")
    a = p.parse_args()
    for context in map(int, a.contexts.split(",")):
        for batch in map(int, a.batches.split(",")):
            print(json.dumps(run(context, batch, a.tokens, a.warmup, a.profile)), flush=True)


if __name__ == "__main__":
    main()

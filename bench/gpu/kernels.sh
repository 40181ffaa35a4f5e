#!/usr/bin/env bash
# Fused sparse-attention kernels against the PyTorch anchors (SDPA, flex_attention, fla NSA), one
# call. From the repository root, with .carry/nsa.xz (a cuda build of `nsa`), .carry/bench_torch.py
# and .carry/whl/ (fla-core and einops wheels, see bench_torch.py's header).
set -u
[ -x .carry/nsa ] || { xz -d -k .carry/nsa.xz && chmod +x .carry/nsa; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl
timeout 300 .carry/nsa bench-kernels --backend cuda --precision bf16 --iters 5 2>&1 | tee $OUT/kernels-bf16.txt
PYTHONPATH=/tmp/site timeout 260 python3 .carry/bench_torch.py attn 2>&1 | tee $OUT/anchor-attn.txt

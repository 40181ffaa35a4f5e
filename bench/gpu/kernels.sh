#!/usr/bin/env bash
# Fused sparse-attention kernels against the PyTorch anchors (SDPA, flex_attention, fla NSA), one
# call. From the repository root, with .carry/nsa.xz (a cuda build of `nsa`), .carry/bench_torch.py
# and .carry/whl/ (fla-core and einops wheels, see bench_torch.py's header).
# Parity against the reference runs first, at T = 2048 (sparse: w and n * l_sel cover a quarter
# and a half of the keys), then the sweep, then the anchors.
set -u
[ -x .carry/nsa ] || { xz -d -k .carry/nsa.xz && chmod +x .carry/nsa; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl
timeout ${KERNELS_S:-300} .carry/nsa bench-kernels --backend cuda --precision bf16 --iters 5 --check-len 2048 \
  2>&1 | tee $OUT/kernels-bf16.txt
# ANCHORS=all runs bench_torch.py's whole attention list (~4 min); the default, the shapes the
# sweep is compared at (~40 s).
if [ "${ANCHORS:-}" = all ]; then
  PYTHONPATH=/tmp/site timeout 260 python3 .carry/bench_torch.py attn 2>&1 | tee $OUT/anchor-attn.txt
else
  PYTHONPATH=/tmp/site timeout 200 python3 bench/gpu/anchor_attn.py 1,65536,64,4,128 1,65536,12,2,64 16,2048,12,2,64 \
    2>&1 | tee $OUT/anchor-attn.txt
fi

#!/usr/bin/env bash
# A build's quick check on the device: bf16 parity against the f64 CPU reference (production
# T = 2049, paper T = 777: the CPU reference at the paper shape and T = 2049 is too slow for a
# call; the parity-only shapes wide (d_k 192, d_v 128) and mha (g = 1) at T = 777), 64k timings of both shapes, then the production-shape anchors in the same call. From the
# repository root, with .carry/whl and .carry/bench_torch.py: `bench/gpu/quick-check.sh .carry/x/nsa.xz`.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
bin=/tmp/nsa; xz -dc "$1" > $bin && chmod +x $bin
timeout 120 $bin bench-kernels --backend cuda --precision bf16 --check-len 2049 --lengths 64 --iters 1 --shapes production 2>&1 | grep -v '^|'
timeout 120 $bin bench-kernels --backend cuda --precision bf16 --check-len 777 --lengths 64 --iters 1 --shapes paper 2>&1 | grep -v '^|'
timeout 120 $bin bench-kernels --backend cuda --precision bf16 --check-len 777 --lengths 64 --iters 1 --shapes wide,mha 2>&1 | grep -v '^|'
timeout 120 $bin bench-kernels --backend cuda --precision bf16 --check-len 0 --lengths 65536 --iters 5 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl
PYTHONPATH=/tmp/site timeout 60 python3 bench/gpu/anchor_attn.py 1,65536,12,2,64 2>&1

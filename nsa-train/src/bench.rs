//! `nsa bench-kernels`: the sparse-attention op, fused path, timed forward and forward+backward
//! at the shapes, after a parity check against the reference path on the same device.
//!
//! Inputs are drawn once per shape (untimed); every timed run is synced and the median kept.
//! Work is counted over attended keys only: forward `4 * keys * d * H_q` FLOPs (`q.k` and
//! `p.v`, `d_k = d_v = d`), forward+backward 3.5x that (flash attention's convention: the
//! backward recomputes the scores and does four more products).

use std::time::Instant;

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Distribution, ElementConversion, Int, Tensor, TensorData};
use nsa_core::SparseAttentionBackend;
use nsa_kernels::{reference, sparse_attention, Keys};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::TrainBackend;

/// One attention shape: query heads, KV heads, head dim.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub name: &'static str,
    pub h_q: usize,
    pub h_kv: usize,
    pub d: usize,
}

/// The shapes: the seeds' production model and the paper's.
pub const SHAPES: [Shape; 2] =
    [Shape { name: "production", h_q: 12, h_kv: 2, d: 64 }, Shape { name: "paper", h_q: 64, h_kv: 4, d: 128 }];

/// NSA's paper settings for the benchmark.
pub const N: usize = 16;
pub const L_SEL: usize = 64;
pub const W: usize = 512;

pub struct BenchOptions {
    pub lengths: Vec<usize>,
    pub iters: usize,
    pub dtype: DType,
    /// Length of the parity check against the reference (the reference is O(T^2)); 0 skips it.
    pub check_len: usize,
    /// Shapes to check and time, from [`SHAPES`].
    pub shapes: Vec<Shape>,
}

/// A random selection per `(t, hk)`: the forced blocks plus random eligible ones up to `N`,
/// padded with -1; and the number of keys it attends summed over rows.
fn random_blocks(rng: &mut StdRng, t_len: usize, h_kv: usize) -> (Vec<i64>, usize) {
    let mut blocks = Vec::with_capacity(t_len * h_kv * N);
    let mut keys = 0;
    for t in 0..t_len {
        for _ in 0..h_kv {
            let current = t / L_SEL;
            let mut row: Vec<usize> = vec![0, current, current.saturating_sub(1)];
            row.sort_unstable();
            row.dedup();
            let mut others: Vec<usize> = (1..current.saturating_sub(1)).collect();
            others.shuffle(rng);
            row.extend(others.into_iter().take(N - row.len()));
            keys += row.iter().map(|&j| ((j + 1) * L_SEL).min(t + 1) - j * L_SEL).sum::<usize>();
            let mut row: Vec<i64> = row.into_iter().map(|j| j as i64).collect();
            row.resize(N, -1);
            blocks.extend(row);
        }
    }
    (blocks, keys)
}

struct Inputs<B: Backend> {
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    grad_out: Tensor<B, 4>,
}

fn inputs<B: Backend>(shape: Shape, t: usize, dtype: DType, device: &B::Device) -> Inputs<B> {
    let draw =
        |h: usize| Tensor::<B, 4>::random([1, t, h, shape.d], Distribution::Normal(0.0, 1.0), device).cast(dtype);
    Inputs { q: draw(shape.h_q), k: draw(shape.h_kv), v: draw(shape.h_kv), grad_out: draw(shape.h_q) }
}

fn median_ms<B: Backend>(device: &B::Device, iters: usize, mut f: impl FnMut()) -> f64 {
    f(); // compile and autotune
    B::sync(device).expect("device sync");
    let mut times: Vec<f64> = (0..iters)
        .map(|_| {
            let start = Instant::now();
            f();
            B::sync(device).expect("device sync");
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// `[out, dq, dk, dv]` of `sum(out * grad_out)` through `attend`.
fn forward_backward<B: AutodiffBackend>(
    x: &Inputs<B::InnerBackend>,
    attend: impl Fn(Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) -> Tensor<B, 4>,
) -> [Tensor<B::InnerBackend, 4>; 4] {
    let track = |t: &Tensor<B::InnerBackend, 4>| Tensor::<B, 4>::from_inner(t.clone()).require_grad();
    let (q, k, v) = (track(&x.q), track(&x.k), track(&x.v));
    let out = attend(q.clone(), k.clone(), v.clone());
    let grads = (out.clone() * Tensor::from_inner(x.grad_out.clone())).sum().backward();
    let g = |t: &Tensor<B, 4>| t.grad(&grads).expect("input has a gradient");
    [out.inner(), g(&q), g(&k), g(&v)]
}

/// Max |a - b| over max |b|, in f32.
fn rel_err<B: Backend>(a: Tensor<B, 4>, b: Tensor<B, 4>) -> f64 {
    let (a, b) = (a.cast(DType::F32), b.cast(DType::F32));
    let scale: f64 = b.clone().abs().max().into_scalar().elem::<f64>();
    let diff: f64 = (a - b).abs().max().into_scalar().elem::<f64>();
    diff / scale.max(1e-12)
}

/// Runs the sweep and prints a markdown table. Returns false when a parity check failed.
pub fn bench_kernels<B: TrainBackend>(device: &B::Device, opts: &BenchOptions) -> bool {
    let mut rng = StdRng::seed_from_u64(0);
    let tol = if opts.dtype == DType::F32 { 1e-3 } else { 3e-2 };
    println!("fused: {}", <B as SparseAttentionBackend>::has_fused_sparse_attention());
    let mut ok = true;
    for shape in opts.shapes.iter().copied().filter(|_| opts.check_len > 0) {
        // Parity on a ragged length, both key sets, against the reference's tensor ops.
        let t = opts.check_len;
        let x = inputs::<B::InnerBackend>(shape, t, opts.dtype, device);
        let (blocks, _) = random_blocks(&mut rng, t, shape.h_kv);
        let blocks =
            Tensor::<B::InnerBackend, 4, Int>::from_data(TensorData::new(blocks, [1, t, shape.h_kv, N]), device);
        for (name, keys) in
            [("window", Keys::Window { w: W }), ("selected", Keys::selected(Tensor::from_inner(blocks), L_SEL))]
        {
            let k: Keys<B> = keys;
            let fused = forward_backward::<B>(&x, |q, kk, v| sparse_attention(q, kk, v, &k).0);
            let want = forward_backward::<B>(&x, |q, kk, v| reference::forward(q, kk, v, &k).0);
            let errs: Vec<f64> = fused.into_iter().zip(want).map(|(a, b)| rel_err(a, b)).collect();
            let pass = errs.iter().all(|e| *e <= tol);
            ok &= pass;
            println!(
                "parity {} {name} T={t}: out {:.1e} dq {:.1e} dk {:.1e} dv {:.1e} (tolerance {tol:.0e}) {}",
                shape.name,
                errs[0],
                errs[1],
                errs[2],
                errs[3],
                if pass { "ok" } else { "FAIL" }
            );
        }
    }
    println!("| shape | T | branch | fwd ms | fwd+bwd ms | fwd TFLOP/s | fwd+bwd TFLOP/s |");
    println!("|---|---|---|---|---|---|---|");
    for shape in opts.shapes.iter().copied() {
        for &t in &opts.lengths {
            let x = inputs::<B::InnerBackend>(shape, t, opts.dtype, device);
            let (blocks, selected_keys) = random_blocks(&mut rng, t, shape.h_kv);
            let blocks =
                Tensor::<B::InnerBackend, 4, Int>::from_data(TensorData::new(blocks, [1, t, shape.h_kv, N]), device);
            let window_keys: usize = (0..t).map(|i| (i + 1).min(W)).sum::<usize>() * shape.h_kv;
            let keys_inner = [Keys::Window { w: W }, Keys::selected(blocks.clone(), L_SEL)];
            let keys_outer: [Keys<B>; 2] = [Keys::Window { w: W }, Keys::selected(Tensor::from_inner(blocks), L_SEL)];
            for ((name, attended), (inner_keys, keys)) in [("window", window_keys), ("selected", selected_keys)]
                .into_iter()
                .zip(keys_inner.into_iter().zip(keys_outer))
            {
                let fwd = median_ms::<B::InnerBackend>(device, opts.iters, || {
                    let _ = sparse_attention(x.q.clone(), x.k.clone(), x.v.clone(), &inner_keys);
                });
                let fb = median_ms::<B::InnerBackend>(device, opts.iters, || {
                    let _ = forward_backward::<B>(&x, |q, k, v| sparse_attention(q, k, v, &keys).0);
                });
                // Keys are counted per KV head row; each of the g query heads attends them.
                let flops = 4.0 * (attended * (shape.h_q / shape.h_kv)) as f64 * shape.d as f64;
                println!(
                    "| {} | {t} | {name} | {fwd:.2} | {fb:.2} | {:.1} | {:.1} |",
                    shape.name,
                    flops / fwd / 1e9,
                    3.5 * flops / fb / 1e9
                );
            }
        }
    }
    ok
}

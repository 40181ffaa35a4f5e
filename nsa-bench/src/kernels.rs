//! `nsa-bench kernels`: the sparse-attention op, fused path (the window, the selected blocks and
//! the compressed branch), timed forward and forward+backward at [`SHAPES`], after a parity
//! check of the op's output and gradients against the reference path in f64 on the CPU (`cpu` feature; on the device in the storage dtype without
//! it). Burn's CUDA backend has no f64, and its f32 matmul may round through TF32 (10-bit
//! mantissa, ~1e-3 relative), which would hide an f32 kernel's real error.
//!
//! Inputs are drawn once per shape (untimed). Each case is timed two ways:
//! - synced: every run is followed by a device sync and the median is kept. This is a latency:
//!   the host's work before the first kernel (autodiff graph, fusion, launches) is not hidden.
//! - pipelined: runs are queued back to back with one sync at the end. The host prepares run
//!   `i + 1` while the device computes run `i`, as in a training step (which never syncs), so
//!   this is the device's time unless the host is the slower side. It is the counterpart of
//!   `triton.testing.do_bench`, which the anchors use: CUDA events around each call, no sync
//!   between calls. A queue also pays costs once, at its start and its closing sync, which a
//!   mean over its runs would spread over them: the time per run is the difference between a
//!   queue of `2 * iters` runs and one of `iters`, over `iters` ([`pipelined_ms`]).
//!
//! The parity check (`crate::parity`) also runs the window and the compressed branch on packed
//! documents, and every plan of the window on them.
//!
//! Timed backward passes are seeded with `dO = 1` ([`Seed::Ones`]); the parity check uses a
//! random `dO`.
//! Work is counted over attended keys only: forward `4 * keys * d * H_q` FLOPs (`q.k` and
//! `p.v`, `d_k = d_v = d`), forward+backward 3.5x that (flash attention's convention: the
//! backward recomputes the scores and does four more products).

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Distribution, Int, Tensor, TensorData};
use nsa_core::SparseAttentionBackend;
use nsa_kernels::{sparse_attention, Keys};
use nsa_train::TrainBackend;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;

use crate::parity::{check_parity, Parity};
use crate::plans::{PlanCheck, PlanParity};
use crate::timing::{median_ms, pipelined_ms};

/// One attention shape: query heads, KV heads, head dim.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub name: &'static str,
    pub h_q: usize,
    pub h_kv: usize,
    pub d_k: usize,
    pub d_v: usize,
}

/// The benchmark shapes: the production model and the paper's, timed; and two that only
/// widen the parity check on the benchmark device: `d_k = 192, d_v = 128` with `g = 16`
/// ("wide"), and one query head per KV head ("mha").
pub const SHAPES: [Shape; 4] = [
    Shape { name: "production", h_q: 12, h_kv: 2, d_k: 64, d_v: 64 },
    Shape { name: "paper", h_q: 64, h_kv: 4, d_k: 128, d_v: 128 },
    Shape { name: "wide", h_q: 16, h_kv: 1, d_k: 192, d_v: 128 },
    Shape { name: "mha", h_q: 4, h_kv: 4, d_k: 64, d_v: 64 },
];

/// NSA's paper settings for the benchmark.
pub const N: usize = 16;
pub const L_SEL: usize = 64;
pub const W: usize = 512;
/// The compressed branch's blocks (the paper's `l` and `d`).
pub const L_CMP: usize = 32;
pub const D_CMP: usize = 16;

/// The compressed branch's keys: blocks of [`L_CMP`] tokens every [`D_CMP`].
pub(crate) fn compressed_keys<B: Backend>() -> Keys<B> {
    Keys::compressed(L_CMP, D_CMP, None)
}

/// Compressed blocks query `t` attends (those complete at `t`).
fn compressed_visible(t: usize) -> usize {
    if t + 1 >= L_CMP {
        (t + 1 - L_CMP) / D_CMP + 1
    } else {
        0
    }
}

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
pub(crate) fn random_blocks(rng: &mut StdRng, t_len: usize, h_kv: usize) -> (Vec<i64>, usize) {
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

#[derive(Clone)]
pub(crate) struct Inputs<B: Backend> {
    pub q: Tensor<B, 4>,
    pub k: Tensor<B, 4>,
    pub v: Tensor<B, 4>,
    pub grad_out: Tensor<B, 4>,
}

impl<B: Backend> Inputs<B> {
    /// The same values on another backend in `dtype` (storage values are exact in f32).
    pub(crate) fn to<C: Backend>(&self, dtype: DType, device: &C::Device) -> Inputs<C> {
        let c = |t: &Tensor<B, 4>| Tensor::<C, 4>::from_data(t.to_data().convert::<f32>(), device).cast(dtype);
        Inputs { q: c(&self.q), k: c(&self.k), v: c(&self.v), grad_out: c(&self.grad_out) }
    }

    /// The compressed branch's inputs: the first `N = (T - l) / d + 1` key and value rows
    /// stand for the compressed blocks (any values do for parity).
    pub(crate) fn compressed(&self) -> Inputs<B> {
        let t = self.q.dims()[1];
        let n = if t >= L_CMP { (t - L_CMP) / D_CMP + 1 } else { 1 };
        let rows = |x: &Tensor<B, 4>| x.clone().narrow(1, 0, n.min(t));
        Inputs { q: self.q.clone(), k: rows(&self.k), v: rows(&self.v), grad_out: self.grad_out.clone() }
    }
}

pub(crate) fn inputs<B: Backend>(shape: Shape, t: usize, dtype: DType, device: &B::Device) -> Inputs<B> {
    let draw =
        |h: usize, d: usize| Tensor::<B, 4>::random([1, t, h, d], Distribution::Normal(0.0, 1.0), device).cast(dtype);
    Inputs {
        q: draw(shape.h_q, shape.d_k),
        k: draw(shape.h_kv, shape.d_k),
        v: draw(shape.h_kv, shape.d_v),
        grad_out: draw(shape.h_q, shape.d_v),
    }
}

/// How a backward is seeded.
#[derive(Clone, Copy)]
pub(crate) enum Seed {
    /// `sum(out * grad_out)`: a random `dO`, for the parity check.
    GradOut,
    /// `out.backward()`: `dO = 1`, for timing. The kernels do the same work for any `dO`, and
    /// this adds one fill kernel where `GradOut` adds a product and a reduction; the anchors
    /// time `fn().backward(dO)`, with neither.
    Ones,
}

/// `[out, dq, dk, dv]` through `attend`, the backward seeded by `seed`.
pub(crate) fn forward_backward<B: AutodiffBackend>(
    x: &Inputs<B::InnerBackend>,
    seed: Seed,
    attend: impl Fn(Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) -> Tensor<B, 4>,
) -> [Tensor<B::InnerBackend, 4>; 4] {
    let track = |t: &Tensor<B::InnerBackend, 4>| Tensor::<B, 4>::from_inner(t.clone()).require_grad();
    let (q, k, v) = (track(&x.q), track(&x.k), track(&x.v));
    let out = attend(q.clone(), k.clone(), v.clone());
    let grads = match seed {
        Seed::GradOut => (out.clone() * Tensor::from_inner(x.grad_out.clone())).sum().backward(),
        Seed::Ones => out.clone().backward(),
    };
    let g = |t: &Tensor<B, 4>| t.grad(&grads).expect("input has a gradient");
    [out.inner(), g(&q), g(&k), g(&v)]
}

pub(crate) fn host<B: Backend>(t: Tensor<B, 4>) -> Vec<f64> {
    t.into_data().convert::<f64>().to_vec::<f64>().expect("float tensor data")
}

/// One row of the timing table (times in ms).
#[derive(Debug, Clone, Serialize)]
pub struct Timing {
    pub shape: &'static str,
    pub t: usize,
    pub branch: &'static str,
    pub fwd_ms: f64,
    pub fwd_bwd_ms: f64,
    pub fwd_tflops: f64,
    pub fwd_bwd_tflops: f64,
    pub pipelined_fwd_ms: f64,
    pub pipelined_fwd_bwd_ms: f64,
    pub pipelined_fwd_bwd_tflops: f64,
    pub queue_mean_fwd_bwd_ms: f64,
    pub host_ms_to_queue_fwd_bwd: f64,
}

/// What `nsa-bench kernels` prints, kept for `kernels.json`.
#[derive(Debug, Clone, Serialize)]
pub struct KernelReport {
    /// Whether the backend has the fused kernels (else the reference path was timed).
    pub fused: bool,
    pub parity: Vec<Parity>,
    /// Every plan the device can run, forced one by one (CUDA and WGPU only).
    pub plans: Vec<PlanParity>,
    pub timings: Vec<Timing>,
}

impl KernelReport {
    /// Every parity check passed.
    pub fn ok(&self) -> bool {
        self.parity.iter().all(|p| p.pass) && self.plans.iter().all(|p| p.pass)
    }
}

/// Runs the sweep and prints a markdown table as it goes.
pub fn bench_kernels<B: TrainBackend>(device: &B::Device, opts: &BenchOptions, plans: PlanCheck) -> KernelReport {
    let mut rng = StdRng::seed_from_u64(0);
    // Same inputs on every run, so that runs of two builds compare.
    B::InnerBackend::seed(device, 0);
    let fused = <B as SparseAttentionBackend>::has_fused_sparse_attention();
    println!("fused: {fused}");
    let mut report = KernelReport { fused, parity: Vec::new(), plans: Vec::new(), timings: Vec::new() };
    for shape in opts.shapes.iter().copied().filter(|_| opts.check_len > 0) {
        check_parity::<B>(shape, opts, plans, &mut rng, device, &mut report);
    }
    println!(
        "| shape | T | branch | fwd ms | fwd+bwd ms | fwd TFLOP/s | fwd+bwd TFLOP/s \
         | pipelined fwd ms | pipelined fwd+bwd ms | pipelined fwd+bwd TFLOP/s \
         | queue mean fwd+bwd ms | host ms to queue a fwd+bwd |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for shape in opts.shapes.iter().copied() {
        for &t in &opts.lengths {
            for row in time_shape::<B>(shape, t, opts, &mut rng, device) {
                println!("{}", row.markdown());
                report.timings.push(row);
            }
        }
    }
    report
}

/// The timings of `shape` at length `t`: each key set forward and forward + backward, synced
/// and pipelined.
fn time_shape<B: TrainBackend>(
    shape: Shape,
    t: usize,
    opts: &BenchOptions,
    rng: &mut StdRng,
    device: &B::Device,
) -> Vec<Timing> {
    let x = inputs::<B::InnerBackend>(shape, t, opts.dtype, device);
    let (blocks, selected_keys) = random_blocks(rng, t, shape.h_kv);
    let blocks = Tensor::<B::InnerBackend, 4, Int>::from_data(TensorData::new(blocks, [1, t, shape.h_kv, N]), device);
    let window_keys: usize = (0..t).map(|i| (i + 1).min(W)).sum::<usize>() * shape.h_kv;
    let compressed_attended: usize = (0..t).map(compressed_visible).sum::<usize>() * shape.h_kv;
    let selected_inner = Keys::selected(blocks.clone(), L_SEL);
    let selected_outer = Keys::selected(Tensor::from_inner(blocks), L_SEL);
    let cases = [
        ("window", window_keys, x.clone(), Keys::window(W, None), Keys::window(W, None)),
        ("selected", selected_keys, x.clone(), selected_inner, selected_outer),
        ("compressed", compressed_attended, x.compressed(), compressed_keys(), compressed_keys()),
    ];
    let mut rows = Vec::new();
    for (branch, attended, x, inner_keys, keys) in cases {
        let fwd = median_ms::<B::InnerBackend>(device, opts.iters, || {
            let _ = sparse_attention(x.q.clone(), x.k.clone(), x.v.clone(), &inner_keys);
        });
        let fb = median_ms::<B::InnerBackend>(device, opts.iters, || {
            let _ = forward_backward::<B>(&x, Seed::Ones, |q, k, v| sparse_attention(q, k, v, &keys).0);
        });
        let fwd_queued = pipelined_ms::<B::InnerBackend, _>(device, opts.iters, || {
            sparse_attention(x.q.clone(), x.k.clone(), x.v.clone(), &inner_keys)
        });
        let fb_queued = pipelined_ms::<B::InnerBackend, _>(device, opts.iters, || {
            forward_backward::<B>(&x, Seed::Ones, |q, k, v| sparse_attention(q, k, v, &keys).0)
        });
        // Keys are counted per KV head row; each of the g query heads attends them.
        let flops = 2.0 * (attended * (shape.h_q / shape.h_kv)) as f64 * (shape.d_k + shape.d_v) as f64;
        rows.push(Timing {
            shape: shape.name,
            t,
            branch,
            fwd_ms: fwd,
            fwd_bwd_ms: fb,
            fwd_tflops: flops / fwd / 1e9,
            fwd_bwd_tflops: 3.5 * flops / fb / 1e9,
            pipelined_fwd_ms: fwd_queued.per_run,
            pipelined_fwd_bwd_ms: fb_queued.per_run,
            pipelined_fwd_bwd_tflops: 3.5 * flops / fb_queued.per_run / 1e9,
            queue_mean_fwd_bwd_ms: fb_queued.mean,
            host_ms_to_queue_fwd_bwd: fb_queued.host,
        });
    }
    rows
}

impl Timing {
    /// The row of the markdown table.
    fn markdown(&self) -> String {
        format!(
            "| {} | {} | {} | {:.2} | {:.2} | {:.1} | {:.1} | {:.2} | {:.2} | {:.1} | {:.2} | {:.2} |",
            self.shape,
            self.t,
            self.branch,
            self.fwd_ms,
            self.fwd_bwd_ms,
            self.fwd_tflops,
            self.fwd_bwd_tflops,
            self.pipelined_fwd_ms,
            self.pipelined_fwd_bwd_ms,
            self.pipelined_fwd_bwd_tflops,
            self.queue_mean_fwd_bwd_ms,
            self.host_ms_to_queue_fwd_bwd,
        )
    }
}

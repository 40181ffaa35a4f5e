//! `nsa-bench gemm`: the linear layers' products through the backend's [`GemmBackend`] (cuBLASLt
//! on CUDA) against Burn's matmul: a parity check of each product and transpose the training
//! step uses (forward `x w`, backward `dY w^T` and `x^T dY`), then the time of each, pipelined
//! (runs queued back to back, one sync at the end), as TFLOP/s.

use std::time::Instant;

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Distribution, ElementConversion, Tensor, TensorPrimitive};
use nsa_kernels::gemm::burn_gemm;
use nsa_kernels::GemmBackend;

/// One product `[m, k] x [k, n]` and the transposes it is taken with.
#[derive(Clone, Copy, Debug)]
pub struct GemmCase {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub transpose_a: bool,
    pub transpose_b: bool,
}

impl GemmCase {
    fn flops(&self) -> f64 {
        2.0 * (self.m * self.k * self.n) as f64
    }

    fn label(&self) -> String {
        let t = |x: bool| if x { "T" } else { "N" };
        format!("{}x{}x{} {}{}", self.m, self.k, self.n, t(self.transpose_a), t(self.transpose_b))
    }
}

/// The three products of a linear layer `[rows, d_in] -> [rows, d_out]`: forward, input
/// gradient, weight gradient.
pub fn linear_cases(rows: usize, d_in: usize, d_out: usize) -> [GemmCase; 3] {
    [
        GemmCase { m: rows, k: d_in, n: d_out, transpose_a: false, transpose_b: false },
        GemmCase { m: rows, k: d_out, n: d_in, transpose_a: false, transpose_b: true },
        GemmCase { m: d_in, k: rows, n: d_out, transpose_a: true, transpose_b: false },
    ]
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct GemmResult {
    pub case: String,
    /// Largest absolute difference from Burn's matmul over the largest absolute value of it.
    pub relative_error: f64,
    pub ours_tflops: f64,
    pub burn_tflops: f64,
}

fn operand<B: Backend>(rows: usize, cols: usize, dtype: DType, device: &B::Device) -> Tensor<B, 2> {
    Tensor::<B, 2>::random([rows, cols], Distribution::Normal(0.0, 1.0), device).cast(dtype)
}

fn product<B: Backend>(
    f: fn(B::FloatTensorPrimitive, B::FloatTensorPrimitive, bool, bool) -> B::FloatTensorPrimitive,
    a: &Tensor<B, 2>,
    b: &Tensor<B, 2>,
    c: &GemmCase,
) -> Tensor<B, 2> {
    let (a, b) = (a.clone().into_primitive().tensor(), b.clone().into_primitive().tensor());
    Tensor::from_primitive(TensorPrimitive::Float(f(a, b, c.transpose_a, c.transpose_b)))
}

/// Pipelined ms per run of `f` over `iters` runs (after two untimed ones).
fn pipelined_ms<B: Backend>(device: &B::Device, iters: usize, mut f: impl FnMut() -> Tensor<B, 2>) -> f64 {
    for _ in 0..2 {
        let _ = f();
    }
    B::sync(device).expect("device sync");
    let start = Instant::now();
    let outs: Vec<_> = (0..iters).map(|_| f()).collect();
    B::sync(device).expect("device sync");
    let ms = start.elapsed().as_secs_f64() * 1e3 / iters as f64;
    drop(outs);
    ms
}

/// Checks and times every case; `tolerance` bounds the relative error.
pub fn bench_gemm<B: GemmBackend>(
    device: &B::Device,
    cases: &[GemmCase],
    dtype: DType,
    iters: usize,
    tolerance: f64,
) -> (Vec<GemmResult>, bool) {
    let mut ok = true;
    let mut results = Vec::new();
    for c in cases {
        let (ar, ac) = if c.transpose_a { (c.k, c.m) } else { (c.m, c.k) };
        let (br, bc) = if c.transpose_b { (c.n, c.k) } else { (c.k, c.n) };
        let a = operand::<B>(ar, ac, dtype, device);
        let b = operand::<B>(br, bc, dtype, device);
        let ours = product::<B>(B::gemm, &a, &b, c).cast(DType::F32);
        let reference = product::<B>(burn_gemm::<B>, &a, &b, c).cast(DType::F32);
        let scale: f64 = reference.clone().abs().max().into_scalar().elem::<f64>();
        let diff: f64 = (ours - reference).abs().max().into_scalar().elem::<f64>();
        let relative_error = diff / scale.max(1e-30);
        let pass = relative_error <= tolerance;
        ok &= pass;
        let ours_ms = pipelined_ms::<B>(device, iters, || product::<B>(B::gemm, &a, &b, c));
        let burn_ms = pipelined_ms::<B>(device, iters, || product::<B>(burn_gemm::<B>, &a, &b, c));
        let result = GemmResult {
            case: c.label(),
            relative_error,
            ours_tflops: c.flops() / (ours_ms * 1e-3) / 1e12,
            burn_tflops: c.flops() / (burn_ms * 1e-3) / 1e12,
        };
        println!(
            "{:<24} error {:.2e} {} | ours {:7.1} TFLOP/s | Burn's matmul {:7.1} TFLOP/s",
            result.case,
            result.relative_error,
            if pass { "ok" } else { "FAIL" },
            result.ours_tflops,
            result.burn_tflops
        );
        results.push(result);
    }
    (results, ok)
}

/// The gradients of a linear layer's product through [`nsa_kernels::linear_matmul`] against
/// Burn's autodiff matmul, on random `x [rows, d_in]`, `w [d_in, d_out]` and output gradient:
/// the largest relative error of the two gradients.
pub fn linear_grad_error<B: burn::tensor::backend::AutodiffBackend + GemmBackend>(
    device: &B::Device,
    rows: usize,
    d_in: usize,
    d_out: usize,
    dtype: DType,
) -> f64 {
    let x = operand::<B>(rows, d_in, dtype, device);
    let w = operand::<B>(d_in, d_out, dtype, device);
    let dy = operand::<B>(rows, d_out, dtype, device);
    let grads = |ours: bool| {
        let (x, w) = (x.clone().detach().require_grad(), w.clone().detach().require_grad());
        let y = if ours { nsa_kernels::linear_matmul(x.clone(), w.clone()) } else { x.clone().matmul(w.clone()) };
        let g = (y * dy.clone()).sum().backward();
        let gx = x.grad(&g).expect("x takes a gradient").cast(DType::F32);
        let gw = w.grad(&g).expect("w takes a gradient").cast(DType::F32);
        (gx, gw)
    };
    let (ours, reference) = (grads(true), grads(false));
    let error = |a: Tensor<B::InnerBackend, 2>, r: Tensor<B::InnerBackend, 2>| {
        let scale: f64 = r.clone().abs().max().into_scalar().elem::<f64>();
        let diff: f64 = (a - r).abs().max().into_scalar().elem::<f64>();
        diff / scale.max(1e-30)
    };
    error(ours.0, reference.0).max(error(ours.1, reference.1))
}

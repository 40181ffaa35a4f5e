//! RMSNorm over the last axis, `y = x / sqrt(mean(x^2) + eps) * gamma`, as a backend extension
//! ([`RmsNormBackend`]).
//!
//! Burn's `RmsNorm` is tensor ops: its forward keeps an f32 copy of `x`, `x / rms` and more for
//! its backward (about three activations per norm, two norms per layer), and runs as several
//! element-wise and reduction kernels each way. Here the forward keeps `x` and one f32 `1 / rms`
//! per row, and on `CubeBackend` each direction is one kernel (plus the sum of the gain's
//! per-cube shares).

mod autodiff;
#[cfg(feature = "cube")]
mod cube;
#[cfg(feature = "fusion")]
mod fusion;
#[cfg(feature = "cube")]
pub mod kernel;

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use crate::stats_dtype;

/// A backend with RMSNorm and its gradients. The defaults are tensor ops (the statistics in f32
/// for half-precision inputs, else in the input's dtype); `CubeBackend` runs kernels; autodiff
/// saves `x`, `gamma` and the row statistics.
pub trait RmsNormBackend: Backend {
    /// `x [rows, d]`, `gamma [d]` (x's dtype) -> `y [rows, d]` and `rstd [rows]`, `1 / rms` of
    /// each row in the statistics dtype.
    fn rms_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        epsilon: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        rms_norm_tensor_ops::<Self>(x, gamma, epsilon)
    }

    /// The gradients of `x` and `gamma` for the output's gradient `grad`.
    fn rms_norm_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        rms_norm_backward_tensor_ops::<Self>(x, gamma, rstd, grad)
    }

    /// Whether the statistics [`Self::rms_norm`] returns are f32 kernels' (else the tensor
    /// ops', in [`stats_dtype`]).
    fn has_rms_norm_kernels() -> bool {
        false
    }
}

/// [`RmsNormBackend::rms_norm`] in tensor ops.
pub fn rms_norm_tensor_ops<B: Backend>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    epsilon: f64,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let (x, gamma) = (float::<B, 2>(x), float::<B, 1>(gamma));
    let dtype = x.dtype();
    let x = x.cast(stats_dtype(dtype));
    let rstd = (x.clone().square().mean_dim(1) + epsilon).sqrt().recip();
    let y = (x * rstd.clone()) * gamma.cast(stats_dtype(dtype)).unsqueeze();
    (y.cast(dtype).into_primitive().tensor(), rstd.flatten::<1>(0, 1).into_primitive().tensor())
}

/// [`RmsNormBackend::rms_norm_backward`] in tensor ops.
pub fn rms_norm_backward_tensor_ops<B: Backend>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    rstd: FloatTensor<B>,
    grad: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let (x, gamma, grad) = (float::<B, 2>(x), float::<B, 1>(gamma), float::<B, 2>(grad));
    let [rows, d] = x.dims();
    let (dtype, gamma_dtype) = (x.dtype(), gamma.dtype());
    let stats = stats_dtype(dtype);
    let rstd = float::<B, 1>(rstd).cast(stats).reshape([rows, 1]);
    let x_hat = x.cast(stats) * rstd.clone();
    let grad = grad.cast(stats);
    let scaled = grad.clone() * gamma.cast(stats).unsqueeze();
    let mean = (scaled.clone() * x_hat.clone()).sum_dim(1).div_scalar(d as f64);
    let grad_x = (scaled - x_hat.clone() * mean) * rstd;
    let grad_gamma = (grad * x_hat).sum_dim(0).reshape([d]);
    (grad_x.cast(dtype).into_primitive().tensor(), grad_gamma.cast(gamma_dtype).into_primitive().tensor())
}

fn float<B: Backend, const D: usize>(x: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

/// [`RmsNormBackend::rms_norm`] over the last axis of `x`, with Burn's `RmsNorm` parameters
/// (`gamma` is cast to `x`'s dtype, as Burn's module requires them to match).
pub fn rms_norm<B: RmsNormBackend, const D: usize>(x: Tensor<B, D>, gamma: Tensor<B, 1>, epsilon: f64) -> Tensor<B, D> {
    let dims = x.dims();
    let d = dims[D - 1];
    let gamma = gamma.cast(x.dtype());
    let x = x.reshape([dims.iter().product::<usize>() / d, d]).into_primitive().tensor();
    let (y, _) = B::rms_norm(x, gamma.into_primitive().tensor(), epsilon);
    float::<B, 2>(y).reshape(dims)
}

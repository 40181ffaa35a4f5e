//! Dense matrix products for the linear layers, as a backend extension ([`GemmBackend`]): on
//! CUDA they run in cuBLASLt on CubeCL's work order ([`cublaslt`]), elsewhere Burn's matmul.
//!
//! One primitive, `C = op(A) op(B)` with `op` a transpose or not, covers a linear layer's
//! forward (`x w`) and both products of its backward (`dC w^T`, `x^T dC`), so the autodiff
//! wrapper needs no other op.

mod autodiff;
#[cfg(feature = "cube")]
mod cube;
#[cfg(feature = "cuda")]
pub mod cublaslt;
#[cfg(feature = "fusion")]
mod fusion;

use burn::tensor::ops::FloatTensor;
use burn::tensor::{backend::Backend, Tensor, TensorPrimitive};

/// A backend that multiplies 2-D matrices, `[M, K] x [K, N] -> [M, N]` after the transposes.
/// The default is Burn's own matmul.
pub trait GemmBackend: Backend {
    /// `op(a) op(b)`, where `op` transposes its matrix when the flag is set.
    fn gemm(a: FloatTensor<Self>, b: FloatTensor<Self>, transpose_a: bool, transpose_b: bool) -> FloatTensor<Self> {
        burn_gemm::<Self>(a, b, transpose_a, transpose_b)
    }
}

/// `op(a) op(b)` with Burn's matmul: the reference the fast paths are held to, and their
/// fallback.
pub fn burn_gemm<B: Backend>(
    a: FloatTensor<B>,
    b: FloatTensor<B>,
    transpose_a: bool,
    transpose_b: bool,
) -> FloatTensor<B> {
    let a = if transpose_a { B::float_swap_dims(a, 0, 1) } else { a };
    let b = if transpose_b { B::float_swap_dims(b, 0, 1) } else { b };
    B::float_matmul(a, b)
}

/// `x [..., K] w [K, N] -> [..., N]`: a linear layer's product, leading dimensions folded into
/// rows.
pub fn linear_matmul<B: GemmBackend, const D: usize>(x: Tensor<B, D>, w: Tensor<B, 2>) -> Tensor<B, D> {
    let dims = x.dims();
    let k = dims[D - 1];
    let rows = dims[..D - 1].iter().product::<usize>();
    let n = w.dims()[1];
    let x = x.reshape([rows, k]).into_primitive().tensor();
    let out = B::gemm(x, w.into_primitive().tensor(), false, false);
    let mut out_dims = dims;
    out_dims[D - 1] = n;
    Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(out)).reshape(out_dims)
}

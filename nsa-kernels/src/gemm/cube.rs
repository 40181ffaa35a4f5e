//! `CubeBackend`: cuBLASLt on the CUDA runtime where it loads, Burn's matmul otherwise (WGPU,
//! and CUDA without the library).

use burn::tensor::DType;
use burn_cubecl::kernel::matmul::{matmul, MatmulStrategy};
use burn_cubecl::kernel::{cast, into_contiguous};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{element::BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::{burn_gemm, GemmBackend};

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> GemmBackend for CubeBackend<R, F, I, BT> {
    fn gemm(a: CubeTensor<R>, b: CubeTensor<R>, transpose_a: bool, transpose_b: bool) -> CubeTensor<R> {
        match cuda_gemm(&a, &b, transpose_a, transpose_b) {
            Some(out) => out,
            None => burn_gemm::<Self>(a, b, transpose_a, transpose_b),
        }
    }
}

/// `op(a_i) op(b_i)` for each matrix of `a [batch, ., .]` and `b [batch, ., .]`, as `out_dtype`
/// (f32 keeps a bf16 product's accumulator): cuBLASLt on CUDA, else Burn's matmul, in
/// `out_dtype` throughout when the inputs differ from it.
///
/// The fallback hands Burn contiguous operands and one fixed kernel, not the autotuned set:
/// while a shape's tuning is pending, autotune runs its first candidate, so two products of
/// one shape could run different kernels, and on Mesa's lavapipe one product of a pair that
/// should agree came out wrong (0.17 relative error) in one run of the compressed tests.
pub fn batched_gemm<R: CubeRuntime>(
    a: CubeTensor<R>,
    b: CubeTensor<R>,
    transpose_a: bool,
    transpose_b: bool,
    out_dtype: DType,
) -> CubeTensor<R> {
    if let Some(out) = cuda_batched_gemm(&a, &b, transpose_a, transpose_b, out_dtype) {
        return out;
    }
    let a = if transpose_a { burn_cubecl::ops::permute(a, &[0, 2, 1]) } else { a };
    let b = if transpose_b { burn_cubecl::ops::permute(b, &[0, 2, 1]) } else { b };
    let widen = |x: CubeTensor<R>| into_contiguous(if x.dtype == out_dtype { x } else { cast(x, out_dtype) });
    matmul(widen(a), widen(b), None, MatmulStrategy::Cube, out_dtype).expect("Burn's matmul takes these operands")
}

/// The product in cuBLASLt when `R` is the CUDA runtime and it can run it.
#[cfg(feature = "cuda")]
fn cuda_gemm<R: CubeRuntime>(a: &CubeTensor<R>, b: &CubeTensor<R>, ta: bool, tb: bool) -> Option<CubeTensor<R>> {
    let (a, b) = (as_cuda(a)?, as_cuda(b)?);
    from_cuda(super::cublaslt::gemm(a, b, ta, tb)?)
}

#[cfg(feature = "cuda")]
fn cuda_batched_gemm<R: CubeRuntime>(
    a: &CubeTensor<R>,
    b: &CubeTensor<R>,
    ta: bool,
    tb: bool,
    out_dtype: DType,
) -> Option<CubeTensor<R>> {
    let (a, b) = (as_cuda(a)?, as_cuda(b)?);
    from_cuda(super::cublaslt::batched_gemm(a, b, ta, tb, out_dtype)?)
}

#[cfg(feature = "cuda")]
fn as_cuda<R: CubeRuntime>(x: &CubeTensor<R>) -> Option<&CubeTensor<cubecl::cuda::CudaRuntime>> {
    (x as &dyn std::any::Any).downcast_ref()
}

#[cfg(feature = "cuda")]
fn from_cuda<R: CubeRuntime>(x: CubeTensor<cubecl::cuda::CudaRuntime>) -> Option<CubeTensor<R>> {
    (Box::new(x) as Box<dyn std::any::Any>).downcast().ok().map(|x| *x)
}

#[cfg(not(feature = "cuda"))]
fn cuda_gemm<R: CubeRuntime>(_: &CubeTensor<R>, _: &CubeTensor<R>, _: bool, _: bool) -> Option<CubeTensor<R>> {
    None
}

#[cfg(not(feature = "cuda"))]
fn cuda_batched_gemm<R: CubeRuntime>(
    _: &CubeTensor<R>,
    _: &CubeTensor<R>,
    _: bool,
    _: bool,
    _: DType,
) -> Option<CubeTensor<R>> {
    None
}

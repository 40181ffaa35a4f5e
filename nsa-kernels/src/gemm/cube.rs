//! `CubeBackend`: cuBLASLt on the CUDA runtime where it loads, Burn's matmul otherwise (WGPU,
//! and CUDA without the library).

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

/// The product in cuBLASLt when `R` is the CUDA runtime and it can run it.
#[cfg(feature = "cuda")]
fn cuda_gemm<R: CubeRuntime>(a: &CubeTensor<R>, b: &CubeTensor<R>, ta: bool, tb: bool) -> Option<CubeTensor<R>> {
    let (a, b) = (as_cuda(a)?, as_cuda(b)?);
    from_cuda(super::cublaslt::gemm(a, b, ta, tb)?)
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

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
    use cubecl::cuda::CudaRuntime;
    use std::any::Any;
    let (a, b) = ((a as &dyn Any).downcast_ref()?, (b as &dyn Any).downcast_ref()?);
    let out: CubeTensor<CudaRuntime> = super::cublaslt::gemm(a, b, ta, tb)?;
    (Box::new(out) as Box<dyn Any>).downcast().ok().map(|out| *out)
}

#[cfg(not(feature = "cuda"))]
fn cuda_gemm<R: CubeRuntime>(_: &CubeTensor<R>, _: &CubeTensor<R>, _: bool, _: bool) -> Option<CubeTensor<R>> {
    None
}

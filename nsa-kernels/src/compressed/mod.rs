//! The compressed branch on `CubeBackend`: queries against the `N` compressed keys, query `t`
//! seeing the blocks complete at `t`.
//!
//! Where the sequence holds at least one block and `N` is the count `T` gives, the branch is a
//! causal attention in disguise ([`interleaved`]): the window kernels run it, flash-style (no
//! `T x N` tensor), on the tensor cores where the plan table ([`crate::plan`]) puts a window
//! there. Otherwise (`T < l`: no row sees a block) it runs as chunked products ([`products`]).

pub mod interleaved;
pub mod products;

use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{element::BoolElement, CubeRuntime, FloatElement, IntElement};

pub use interleaved::Interleaved;
pub use products::Products;

/// Output `[B, T, H_q, d_v]` and log-sum-exp `[B, T, H_q]` (f32).
pub fn forward<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    length: usize,
    stride: usize,
) -> (CubeTensor<R>, CubeTensor<R>) {
    match Interleaved::new(&q, &k, length, stride) {
        Some(layout) => layout.forward::<F, I, BT, R>(q, k, v),
        None => Products::new(q, k, v, length, stride).forward(),
    }
}

/// Gradients of `q`, `k`, `v`.
#[allow(clippy::too_many_arguments)]
pub fn backward<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    out: CubeTensor<R>,
    lse: CubeTensor<R>,
    grad_out: CubeTensor<R>,
    length: usize,
    stride: usize,
) -> [CubeTensor<R>; 3] {
    match Interleaved::new(&q, &k, length, stride) {
        Some(layout) => layout.backward::<F, I, BT, R>(q, k, v, out, lse, grad_out),
        None => Products::new(q, k, v, length, stride).backward(lse, grad_out),
    }
}

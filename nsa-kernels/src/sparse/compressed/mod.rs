//! The compressed branch on `CubeBackend`: queries against the `N` compressed keys, query `t`
//! seeing the blocks complete at `t`. It is a causal attention in disguise ([`interleaved`]):
//! the window kernels run it, flash-style (no `T x N` tensor), on the tensor cores where the
//! plan table ([`crate::sparse::plan`]) puts a window there. A sequence shorter than one block has no
//! key any row sees: its output is zero, its log-sum-exp `NEG_LARGE` and its gradients zero.

pub mod interleaved;

use burn::tensor::{DType, Shape};
use burn_cubecl::ops::numeric::{full_device_dtype, zeros};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{element::BoolElement, CubeRuntime, FloatElement, IntElement};
use cubecl::prelude::InputScalar;

pub use interleaved::Interleaved;

use crate::kernel::primitives::rows::NEG_LARGE;

/// Output `[B, T, H_q, d_v]` and log-sum-exp `[B, T, H_q]` (f32); with document `starts`
/// `[B, T]`, each row sees only its document's blocks.
pub fn forward<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    length: usize,
    stride: usize,
    starts: Option<&CubeTensor<R>>,
) -> (CubeTensor<R>, CubeTensor<R>) {
    match layout(&q, &k, length, stride) {
        Some(layout) => layout.forward::<F, I, BT, R>(q, k, v, starts),
        None => {
            let [b, t, h_q, _] = q.meta.shape().dims::<4>();
            let out = zeros::<R>(q.device.clone(), Shape::new([b, t, h_q, v.meta.shape()[3]]), q.dtype);
            let lse = full_device_dtype::<R>(
                q.client.clone(),
                Shape::new([b, t, h_q]),
                q.device.clone(),
                InputScalar::new(NEG_LARGE, DType::F32),
                DType::F32,
            );
            (out, lse)
        }
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
    starts: Option<&CubeTensor<R>>,
) -> [CubeTensor<R>; 3] {
    match layout(&q, &k, length, stride) {
        Some(layout) => layout.backward::<F, I, BT, R>(q, k, v, out, lse, grad_out, starts),
        None => [&q, &k, &v].map(|x| zeros::<R>(x.device.clone(), x.meta.shape().clone(), x.dtype)),
    }
}

/// The interleaved layout, or `None` for a sequence shorter than one block. Panics with one line
/// when the key count is not the `(T - length) / stride + 1` blocks `T` gives (a caller's bug).
fn layout<R: CubeRuntime>(q: &CubeTensor<R>, k: &CubeTensor<R>, length: usize, stride: usize) -> Option<Interleaved> {
    assert!(length > 0 && stride > 0, "compressed blocks need a length and a stride");
    let t = q.meta.shape()[1];
    if t < length {
        return None;
    }
    let layout = Interleaved::new(q, k, length, stride);
    assert!(
        layout.is_some(),
        "the compressed branch got {} key rows; {t} tokens give {} blocks of {length} every {stride}",
        k.meta.shape()[1],
        (t - length) / stride + 1
    );
    layout
}

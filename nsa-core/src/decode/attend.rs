//! One query position per sequence against a set of cached keys, in tensor ops: what every
//! branch of a decode step computes once its keys are gathered.

use burn::tensor::{backend::Backend, Bool, Tensor};
use nsa_kernels::stats_dtype;

/// Output `[B, H_kv, g, d_v]` and probabilities `[B, H_kv, g, S]` (statistics dtype) of the
/// queries `q: [B, H_kv, g, d_k]` over the keys `k: [B, H_kv, S, d_k]` that `visible`
/// (`[B, 1 or H_kv, 1, S]`) marks. A row that sees no key outputs zeros (the compressed branch
/// before its first block).
pub fn attend<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    visible: Tensor<B, 4, Bool>,
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let [b, h, g, d_k] = q.dims();
    let s = k.dims()[2];
    let dtype = q.dtype();
    let shape = [b, h, g, s];
    let scores = q.matmul(k.swap_dims(2, 3)).cast(stats_dtype(dtype)).mul_scalar(1.0 / (d_k as f64).sqrt());
    let visible = visible.expand(shape);
    let scores = scores.mask_fill(visible.clone().bool_not(), f32::NEG_INFINITY);
    // A row with no visible key: its max is -inf; take 0 so exp gives zeros, not NaN.
    let max = scores.clone().max_dim(3);
    let max = max.clone().mask_fill(max.is_inf(), 0.0);
    let exp = (scores - max.expand(shape)).exp();
    let sum = exp.clone().sum_dim(3);
    let sum = sum.clone().mask_fill(sum.clone().equal_elem(0.0), 1.0);
    let probs = exp / sum.expand(shape);
    let out = probs.clone().cast(dtype).matmul(v);
    (out, probs)
}

//! Masked softmax attention with GQA broadcasting: the reference every fused kernel is held to.

use burn::tensor::{activation, backend::Backend, Bool, DType, Tensor};

/// `softmax(q k^T * scale) v` over the keys `allowed` marks, for all `g` query heads of each KV
/// head at once (K/V are not repeated per query head).
///
/// - `q`: `[B, H_kv, g, T, d_k]`, `k`: `[B, H_kv, S, d_k]`, `v`: `[B, H_kv, S, d_v]`
/// - `allowed`: broadcastable to `[B, H_kv, g, T, S]`; every row must allow at least one key.
///
/// Returns the output `[B, H_kv, g, T, d_v]` and the probabilities `[B, H_kv, g, T, S]`.
/// Memory: the probabilities are materialised, `B * H_q * T * S` elements.
pub fn masked_attention<B: Backend>(
    q: Tensor<B, 5>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    allowed: Tensor<B, 5, Bool>,
) -> (Tensor<B, 5>, Tensor<B, 5>) {
    let [b, h, g, t, d_k] = q.dims();
    let s = k.dims()[2];
    let d_v = v.dims()[3];
    let scale = 1.0 / (d_k as f64).sqrt();
    let scores = q.reshape([b, h, g * t, d_k]).matmul(k.swap_dims(2, 3)).reshape([b, h, g, t, s]).mul_scalar(scale);
    let blocked = allowed.bool_not().expand([b, h, g, t, s]);
    let probs = softmax_f32(scores.mask_fill(blocked, f32::NEG_INFINITY), 4);
    let out = probs.clone().reshape([b, h, g * t, s]).matmul(v).reshape([b, h, g, t, d_v]);
    (out, probs)
}

/// Softmax whose statistics are computed in f32 when the storage is a 16-bit float; wider
/// storage is kept as it is.
pub fn softmax_f32<const D: usize, B: Backend>(x: Tensor<B, D>, dim: usize) -> Tensor<B, D> {
    let dtype = x.dtype();
    if matches!(dtype, DType::F16 | DType::BF16) {
        activation::softmax(x.cast(DType::F32), dim).cast(dtype)
    } else {
        activation::softmax(x, dim)
    }
}

//! The reference path: masked dense attention in Burn tensor ops, on any backend.
//!
//! It materialises the `[B, H_kv, g, T, T]` scores and probabilities, so it is O(T^2) in time
//! and memory. It is what backends without fused kernels run, and what the kernels are held to
//! (the tests hold both to a float64 loop version of the spec).

use burn::tensor::ops::FloatTensor;
use burn::tensor::{backend::Backend, Bool, DType, Int, Tensor, TensorPrimitive};

use crate::api::Keys;

/// The dtype softmax statistics are kept in: f32 for 16-bit storage, else the storage dtype.
pub fn stats_dtype(storage: DType) -> DType {
    match storage {
        DType::F16 | DType::BF16 => DType::F32,
        other => other,
    }
}

/// Which keys each query attends, `[B or 1, H_kv or 1, T, T]` (query, key).
pub fn key_mask<B: Backend>(keys: &Keys<B>, t: usize, device: &B::Device) -> Tensor<B, 4, Bool> {
    let query = Tensor::<B, 1, Int>::arange(0..t as i64, device).reshape([t, 1]);
    let key = Tensor::<B, 1, Int>::arange(0..t as i64, device).reshape([1, t]);
    let lag = (query - key).reshape([1, 1, t, t]); // t - s
    let causal = lag.clone().greater_equal_elem(0);
    match keys {
        Keys::Window { w } => causal.bool_and(lag.lower_elem(*w as i64)),
        Keys::Selected { blocks, block_size, .. } => {
            let blocks = Tensor::<B, 4, Int>::from_primitive(blocks.clone());
            let [b, _, h, n] = blocks.dims();
            let key_block = Tensor::<B, 1, Int>::arange(0..t as i64, device).div_scalar(*block_size as i64);
            let shape = [b, t, h, n, t];
            let listed = blocks
                .reshape([b, t, h, n, 1])
                .expand(shape)
                .equal(key_block.reshape([1, 1, 1, 1, t]).expand(shape))
                .any_dim(3)
                .reshape([b, t, h, t])
                .permute([0, 2, 1, 3]);
            listed.bool_and(causal.expand([b, h, t, t]))
        }
    }
}

/// `[B, T, H, d]` -> `[B, H_kv, g, T, d]` for queries (`H = g * H_kv`).
fn group_queries<B: Backend>(x: Tensor<B, 4>, h_kv: usize) -> Tensor<B, 5> {
    let [b, t, h, d] = x.dims();
    x.reshape([b, t, h_kv, h / h_kv, d]).permute([0, 2, 3, 1, 4])
}

/// Inverse of [`group_queries`].
fn ungroup_queries<B: Backend>(x: Tensor<B, 5>) -> Tensor<B, 4> {
    let [b, h_kv, g, t, d] = x.dims();
    x.permute([0, 3, 1, 2, 4]).reshape([b, t, h_kv * g, d])
}

/// Scaled scores in the statistics dtype, `-inf` where a key is not attended:
/// `[B, H_kv, g, T, T]`.
fn masked_scores<B: Backend>(q5: Tensor<B, 5>, k: Tensor<B, 4>, keys: &Keys<B>) -> Tensor<B, 5> {
    let [b, h_kv, g, t, d_k] = q5.dims();
    let stats = stats_dtype(q5.dtype());
    let kt = k.permute([0, 2, 3, 1]); // [B, H_kv, d_k, T]
    let scores = q5.reshape([b, h_kv, g * t, d_k]).matmul(kt).reshape([b, h_kv, g, t, t]);
    let scores = scores.cast(stats).mul_scalar(1.0 / (d_k as f64).sqrt());
    let mask = key_mask(keys, t, &scores.device());
    let [mb, mh, _, _] = mask.dims();
    let blocked = mask.bool_not().reshape([mb, mh, 1, t, t]).expand([b, h_kv, g, t, t]);
    scores.mask_fill(blocked, f32::NEG_INFINITY)
}

/// Output `[B, T, H_q, d_v]` and log-sum-exp `[B, T, H_q]`.
pub fn forward<B: Backend>(q: Tensor<B, 4>, k: Tensor<B, 4>, v: Tensor<B, 4>, keys: &Keys<B>) -> (Tensor<B, 4>, Tensor<B, 3>) {
    let [b, t, h_q, _] = q.dims();
    let [_, _, h_kv, d_v] = v.dims();
    let dtype = q.dtype();
    let scores = masked_scores(group_queries(q, h_kv), k, keys);
    let lse = log_sum_exp(scores.clone());
    let probs = (scores - lse.clone()).exp().cast(dtype);
    let g = h_q / h_kv;
    let out = probs.reshape([b, h_kv, g * t, t]).matmul(v.permute([0, 2, 1, 3])).reshape([b, h_kv, g, t, d_v]);
    (ungroup_queries(out), ungroup_queries(lse).reshape([b, t, h_q]))
}

/// [`forward`] on primitives: the trait's default, also reached from overrides.
pub(crate) fn forward_primitive<B: Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    keys: &Keys<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let f = |t| Tensor::<B, 4>::from_primitive(TensorPrimitive::Float(t));
    let (out, lse) = forward(f(q), f(k), f(v), keys);
    (out.into_primitive().tensor(), lse.into_primitive().tensor())
}

/// `log(sum(exp(x)))` over the last axis, keeping it: `[.., T, 1]`.
fn log_sum_exp<B: Backend>(scores: Tensor<B, 5>) -> Tensor<B, 5> {
    let max = scores.clone().max_dim(4);
    let max = max.clone().mask_fill(max.is_inf(), 0.0); // a row with no key: exp(-inf - 0) = 0
    (scores - max.clone()).exp().sum_dim(4).log() + max
}

/// Gradients `[dq, dk, dv]` of `sum(out * grad_out)`, from the probabilities recomputed with the
/// saved log-sum-exp (the same formulas the fused backward uses).
pub fn backward<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    out: Tensor<B, 4>,
    lse: Tensor<B, 3>,
    grad_out: Tensor<B, 4>,
    keys: &Keys<B>,
) -> [Tensor<B, 4>; 3] {
    let [b, t, h_q, d_k] = q.dims();
    let [_, _, h_kv, d_v] = v.dims();
    let g = h_q / h_kv;
    let dtype = q.dtype();
    let stats = stats_dtype(dtype);
    let scale = 1.0 / (d_k as f64).sqrt();
    let q5 = group_queries(q, h_kv);
    let lse = group_queries(lse.reshape([b, t, h_q, 1]), h_kv).cast(stats);
    let probs = (masked_scores(q5.clone(), k.clone(), keys) - lse).exp(); // [B, H_kv, g, T, T]
    let d_out = group_queries(grad_out, h_kv).cast(stats);
    let delta = (d_out.clone() * group_queries(out, h_kv).cast(stats)).sum_dim(4);
    let flat = |x: Tensor<B, 5>, d: usize| x.reshape([b, h_kv, g * t, d]);
    let keys_first = |x: Tensor<B, 4>| x.permute([0, 2, 1, 3]).cast(stats); // [B, H_kv, T, d]

    let dv = flat(probs.clone(), t).swap_dims(2, 3).matmul(flat(d_out.clone(), d_v));
    let dp = flat(d_out, d_v).matmul(keys_first(v).swap_dims(2, 3)).reshape([b, h_kv, g, t, t]);
    let ds = flat(probs * (dp - delta), t).mul_scalar(scale);
    let dq = ds.clone().matmul(keys_first(k)).reshape([b, h_kv, g, t, d_k]);
    let dk = ds.swap_dims(2, 3).matmul(flat(q5.cast(stats), d_k));
    let kv_layout = |x: Tensor<B, 4>| x.permute([0, 2, 1, 3]).cast(dtype);
    [ungroup_queries(dq).cast(dtype), kv_layout(dk), kv_layout(dv)]
}

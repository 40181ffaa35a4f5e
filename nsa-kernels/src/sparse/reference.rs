//! The reference path: masked dense attention in Burn tensor ops, on any backend.
//!
//! It materialises the `[B, H_kv, g, T, T]` scores and probabilities, so it is O(T^2) in time
//! and memory. It is what backends without fused kernels run, and what the kernels are held to
//! (the tests hold both to a float64 loop version of the spec).

use burn::tensor::ops::FloatTensor;
use burn::tensor::{backend::Backend, Bool, Int, Tensor, TensorPrimitive};

use crate::sparse::api::{Selection, SparseAttentionGrads};
use crate::sparse::documents::Documents;
use crate::sparse::keys::{Keys, Route, TokenKeys};
use crate::stats_dtype;

/// Which keys each query attends, `[B or 1, H_kv or 1, T, S]` (query, key) for `S` keys; with
/// the key set's documents, only the keys of the query's own document (`[B, H_kv or 1, T, S]`).
pub fn key_mask<B: Backend>(keys: &Keys<B>, t: usize, s: usize, device: &B::Device) -> Tensor<B, 4, Bool> {
    let mask = set_mask(keys, t, s, device);
    // A key's first token is its position, or a compressed block's first position.
    let (documents, stride) = match keys.route() {
        Route::Compressed { stride, documents, .. } => (documents, stride),
        Route::Tokens(TokenKeys::Window { documents, .. }) => (documents, 1),
        Route::Tokens(TokenKeys::Selected { .. }) => (None, 1),
    };
    let Some(starts) = documents else { return mask };
    let starts = Tensor::<B, 2, Int>::from_primitive(starts.clone());
    let b = starts.dims()[0];
    let first = Tensor::<B, 1, Int>::arange(0..s as i64, device).mul_scalar(stride as i64).reshape([1, 1, 1, s]);
    let own = first.expand([b, 1, t, s]).greater_equal(starts.reshape([b, 1, t, 1]).expand([b, 1, t, s]));
    let [_, h, _, _] = mask.dims();
    mask.expand([b, h, t, s]).bool_and(own.expand([b, h, t, s]))
}

/// [`key_mask`] within one document per row.
fn set_mask<B: Backend>(keys: &Keys<B>, t: usize, s: usize, device: &B::Device) -> Tensor<B, 4, Bool> {
    let query = Tensor::<B, 1, Int>::arange(0..t as i64, device).reshape([t, 1]);
    let keys = match keys.route() {
        Route::Tokens(keys) => keys,
        Route::Compressed { length, stride, .. } => {
            let last_token = Tensor::<B, 1, Int>::arange(0..s as i64, device)
                .mul_scalar(stride as i64)
                .add_scalar(length as i64 - 1)
                .reshape([1, s]);
            return last_token.expand([t, s]).lower_equal(query.expand([t, s])).reshape([1, 1, t, s]);
        }
    };
    let key = Tensor::<B, 1, Int>::arange(0..t as i64, device).reshape([1, t]);
    let lag = (query - key).reshape([1, 1, t, t]); // t - s
    let causal = lag.clone().greater_equal_elem(0);
    match keys {
        TokenKeys::Window { w, .. } => causal.bool_and(lag.lower_elem(w as i64)),
        TokenKeys::Selected { blocks, block_size, .. } => {
            let blocks = Tensor::<B, 4, Int>::from_primitive(blocks.clone());
            let [b, _, h, n] = blocks.dims();
            let key_block = Tensor::<B, 1, Int>::arange(0..t as i64, device).div_scalar(block_size as i64);
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

/// Eq. 9 weights `[n_cmp, n_sel]`: the share of compressed block `i`'s `length` tokens that
/// fall in selection block `j`, `|[i*stride, i*stride+length) ∩ [j*block_size, (j+1)*block_size)|
/// / length`, in the default float dtype.
pub fn overlap_weights<B: Backend>(
    n_cmp: usize,
    n_sel: usize,
    length: usize,
    stride: usize,
    block_size: usize,
    device: &B::Device,
) -> Tensor<B, 2> {
    let cmp_start = Tensor::<B, 1, Int>::arange(0..n_cmp as i64, device)
        .mul_scalar(stride as i64)
        .reshape([n_cmp, 1])
        .expand([n_cmp, n_sel]);
    let cmp_end = cmp_start.clone().add_scalar(length as i64);
    let sel_start = Tensor::<B, 1, Int>::arange(0..n_sel as i64, device)
        .mul_scalar(block_size as i64)
        .reshape([1, n_sel])
        .expand([n_cmp, n_sel]);
    let sel_end = sel_start.clone().add_scalar(block_size as i64);
    let overlap = cmp_end.min_pair(sel_end) - cmp_start.max_pair(sel_start);
    overlap.clamp_min(0).float().div_scalar(length as f64)
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

/// Scaled scores in the statistics dtype, `-inf` where `mask` (`[B or 1, H_kv or 1, T, S]`)
/// does not attend: `[B, H_kv, g, T, S]`.
fn masked_scores<B: Backend>(q5: Tensor<B, 5>, k: Tensor<B, 4>, mask: Tensor<B, 4, Bool>) -> Tensor<B, 5> {
    let [b, h_kv, g, t, d_k] = q5.dims();
    let s = k.dims()[1];
    let stats = stats_dtype(q5.dtype());
    let kt = k.permute([0, 2, 3, 1]); // [B, H_kv, d_k, S]
    let scores = q5.reshape([b, h_kv, g * t, d_k]).matmul(kt).reshape([b, h_kv, g, t, s]);
    let scores = scores.cast(stats).mul_scalar(1.0 / (d_k as f64).sqrt());
    let [mb, mh, _, _] = mask.dims();
    let blocked = mask.bool_not().reshape([mb, mh, 1, t, s]).expand([b, h_kv, g, t, s]);
    scores.mask_fill(blocked, f32::NEG_INFINITY)
}

/// Output `[B, T, H_q, d_v]` and log-sum-exp `[B, T, H_q]`.
///
/// A row that attends no key (only a compressed key set has such rows) is computed as if it
/// attended key 0 and then zeroed, so that neither its output nor its gradient is `NaN`; its
/// log-sum-exp is `-1e30`, as the kernels write it.
pub fn forward<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    keys: &Keys<B>,
) -> (Tensor<B, 4>, Tensor<B, 3>) {
    let [b, t, h_q, _] = q.dims();
    let [_, s, h_kv, d_v] = v.dims();
    let dtype = q.dtype();
    let device = q.device();
    let mask = key_mask(keys, t, s, &device);
    // `[B or 1, H_kv or 1, T, 1]`: rows with no key.
    let sees_none = mask.clone().bool_not().all_dim(3);
    let first_key = Tensor::<B, 1, Int>::arange(0..s as i64, &device).equal_elem(0).reshape([1, 1, 1, s]);
    let [mb, mh, _, _] = mask.dims();
    let mask = mask.bool_or(first_key.expand([mb, mh, t, s]).bool_and(sees_none.clone().expand([mb, mh, t, s])));
    let scores = masked_scores(group_queries(q, h_kv), k, mask);
    let lse = log_sum_exp(scores.clone());
    let probs = (scores - lse.clone()).exp().cast(dtype);
    let g = h_q / h_kv;
    let out = probs.reshape([b, h_kv, g * t, s]).matmul(v.permute([0, 2, 1, 3])).reshape([b, h_kv, g, t, d_v]);
    let none5 = sees_none.reshape([mb, mh, 1, t, 1]);
    let out = out.mask_fill(none5.clone().expand([b, h_kv, g, t, d_v]), 0.0);
    let lse = lse.mask_fill(none5.expand([b, h_kv, g, t, 1]), -1.0e30);
    (ungroup_queries(out), ungroup_queries(lse).reshape([b, t, h_q]))
}

/// The spec's selection scores `[B, H_kv, T, ceil(T / block_size)]` (Eq. 9, then the Eq. 10 sum over
/// each group's heads) of `q` against the compressed keys `k`: the probabilities are recomputed
/// from the compressed branch's `lse`. What the top-n ranks where a backend has no selection kernel.
/// With `documents`, a row's compressed blocks before its document start add nothing.
pub fn block_scores<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    lse: Tensor<B, 3>,
    selection: Selection,
    documents: Option<&Documents<B>>,
) -> Tensor<B, 4> {
    let Selection { length, stride, block_size, .. } = selection;
    let [b, t, h_q, _] = q.dims();
    let [_, n, h_kv, _] = k.dims();
    let device = q.device();
    let stats = stats_dtype(q.dtype());
    let mask = key_mask(&Keys::compressed(length, stride, documents), t, n, &device);
    let scores = masked_scores(group_queries(q, h_kv), k, mask); // [B, H_kv, g, T, N]
    let lse = group_queries(lse.reshape([b, t, h_q, 1]), h_kv).cast(stats);
    let summed = (scores - lse).exp().sum_dim(2).reshape([b * h_kv * t, n]);
    let n_sel = t.div_ceil(block_size);
    let weights = overlap_weights::<B>(n, n_sel, length, stride, block_size, &device).cast(stats);
    summed.matmul(weights).reshape([b, h_kv, t, n_sel])
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

/// [`backward`] on primitives: the trait's default, also reached from overrides.
pub(crate) fn backward_primitive<B: Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    out: FloatTensor<B>,
    lse: FloatTensor<B>,
    grad_out: FloatTensor<B>,
    keys: &Keys<B>,
) -> SparseAttentionGrads<B> {
    let f = |t| Tensor::<B, 4>::from_primitive(TensorPrimitive::Float(t));
    let lse = Tensor::<B, 3>::from_primitive(TensorPrimitive::Float(lse));
    let [q, k, v] =
        backward::<B>(f(q), f(k), f(v), f(out), lse, f(grad_out), keys).map(|x| x.into_primitive().tensor());
    SparseAttentionGrads { q, k, v }
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
    let s = k.dims()[1];
    let mask = key_mask(keys, t, s, &q5.device());
    let probs = (masked_scores(q5.clone(), k.clone(), mask) - lse).exp(); // [B, H_kv, g, T, S]
    let d_out = group_queries(grad_out, h_kv).cast(stats);
    let delta = (d_out.clone() * group_queries(out, h_kv).cast(stats)).sum_dim(4);
    let flat = |x: Tensor<B, 5>, d: usize| x.reshape([b, h_kv, g * t, d]);
    let keys_first = |x: Tensor<B, 4>| x.permute([0, 2, 1, 3]).cast(stats); // [B, H_kv, T, d]

    let dv = flat(probs.clone(), s).swap_dims(2, 3).matmul(flat(d_out.clone(), d_v));
    let dp = flat(d_out, d_v).matmul(keys_first(v).swap_dims(2, 3)).reshape([b, h_kv, g, t, s]);
    let ds = flat(probs * (dp - delta), s).mul_scalar(scale);
    let dq = ds.clone().matmul(keys_first(k)).reshape([b, h_kv, g, t, d_k]);
    let dk = ds.swap_dims(2, 3).matmul(flat(q5.cast(stats), d_k));
    let kv_layout = |x: Tensor<B, 4>| x.permute([0, 2, 1, 3]).cast(dtype);
    [ungroup_queries(dq).cast(dtype), kv_layout(dk), kv_layout(dv)]
}

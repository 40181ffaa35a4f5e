//! The backend extension: what a backend must provide, with the reference as the default.

use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{backend::Backend, Int, Shape, Tensor, TensorPrimitive};

use crate::sparse::documents::Documents;
use crate::sparse::keys::{BlockIndex, Keys};
use crate::sparse::reference;

/// `keys` with the backend's inverted block index attached, if it builds one and `keys` is a
/// selection without one.
pub fn with_block_index<B: SparseAttentionBackend>(keys: Keys<B>) -> Keys<B> {
    match keys {
        Keys::Selected { blocks, block_size, index: None } => {
            let index = B::block_index(&blocks, block_size);
            Keys::Selected { blocks, block_size, index }
        }
        keys => keys,
    }
}

/// Gradients of the query, key and value tensors.
pub struct SparseAttentionGrads<B: Backend> {
    pub q: FloatTensor<B>,
    pub k: FloatTensor<B>,
    pub v: FloatTensor<B>,
}

/// A backend that can run NSA's sparse attention. The defaults are the reference path; a
/// backend with fused kernels overrides all three.
///
/// Shapes: `q [B, T, H_q, d_k]`, `k [B, T, H_kv, d_k]`, `v [B, T, H_kv, d_v]` (`N` compressed
/// rows in place of `T` for [`Keys::Compressed`]) with `H_q = g * H_kv`; query head `h` reads KV
/// head `h / g`. Output `[B, T, H_q, d_v]` in the storage dtype and log-sum-exp `[B, T, H_q]` in
/// f32 (f64 when the storage is f64).
pub trait SparseAttentionBackend:
    crate::gemm::GemmBackend
    + crate::activation::ActivationBackend
    + crate::mix::GatedMixBackend
    + crate::norm::RmsNormBackend
{
    /// Whether [`Self::sparse_attention`] is a fused kernel with a matching fused backward.
    /// When false, autodiff differentiates the reference's tensor ops instead.
    fn has_fused_sparse_attention() -> bool {
        false
    }

    /// The inverted index of a selection's `blocks` `[B, T, H_kv, n]`, for a backend whose
    /// kernels walk one (`None`: the reference needs none). Autodiff attaches it to the key set
    /// it saves, so the forward and the backward use one index.
    fn block_index(_blocks: &IntTensor<Self>, _block_size: usize) -> Option<BlockIndex<Self>> {
        None
    }

    /// The shapes of [`Self::block_index`]'s tensors for `blocks` of shape `blocks`, all u32
    /// (`None` when it builds none): what a wrapper that records ops before running them
    /// (fusion) declares.
    fn block_index_shapes(_blocks: &Shape, _block_size: usize) -> Option<Vec<Shape>> {
        None
    }

    /// Attention output and per-row log-sum-exp of the scaled scores.
    fn sparse_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        keys: &Keys<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        reference::forward_primitive::<Self>(q, k, v, keys)
    }

    /// The spec's block selection from the compressed branch: the scores (Eq. 9, the Eq. 10 sum
    /// over each group's heads) of `q [B, T, H_q, d_k]` against the compressed keys
    /// `k [B, N, H_kv, d_k]` with the branch's log-sum-exp `lse [B, T, H_q]`, then the top-n
    /// (block 0 and the local blocks `t / block_size` and `t / block_size - 1` always taken and
    /// counted towards `n`; the rest the eligible blocks `j * block_size <= t` with the highest
    /// scores, ties to the lower index). Returns the block lists `[B, T, H_kv, n]` (ascending,
    /// `-1` in unused slots), or `None` where the backend has no kernel for it (the caller
    /// ranks [`crate::sparse::reference::block_scores`] in tensor ops). Not differentiated.
    fn select_blocks(
        _q: FloatTensor<Self>,
        _k: FloatTensor<Self>,
        _lse: FloatTensor<Self>,
        _selection: Selection,
        _documents: Option<IntTensor<Self>>,
    ) -> Option<IntTensor<Self>> {
        None
    }

    /// Gradients of `q`, `k`, `v` given the forward's output, its log-sum-exp and the output's
    /// gradient.
    fn sparse_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        grad_out: FloatTensor<Self>,
        keys: &Keys<Self>,
    ) -> SparseAttentionGrads<Self> {
        reference::backward_primitive::<Self>(q, k, v, out, lse, grad_out, keys)
    }
}

/// [`SparseAttentionBackend::sparse_attention`] on tensors: `(output, log-sum-exp)`.
pub fn sparse_attention<B: SparseAttentionBackend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    keys: &Keys<B>,
) -> (Tensor<B, 4>, Tensor<B, 3>) {
    let (out, lse) = B::sparse_attention(
        q.into_primitive().tensor(),
        k.into_primitive().tensor(),
        v.into_primitive().tensor(),
        keys,
    );
    (Tensor::from_primitive(TensorPrimitive::Float(out)), Tensor::from_primitive(TensorPrimitive::Float(lse)))
}

/// [`SparseAttentionBackend::select_blocks`] on tensors, for packed rows with `documents`.
pub fn select_blocks<B: SparseAttentionBackend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    lse: Tensor<B, 3>,
    selection: Selection,
    documents: Option<&Documents<B>>,
) -> Option<Tensor<B, 4, Int>> {
    let [q, k, lse] = [q.into_primitive().tensor(), k.into_primitive().tensor(), lse.into_primitive().tensor()];
    B::select_blocks(q, k, lse, selection, documents.map(Documents::primitive)).map(Tensor::from_primitive)
}

/// How a selection is chosen: compressed blocks of `length` tokens every `stride` (what the
/// scores are computed from), selection blocks of `block_size` tokens, `n` of them per query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Selection {
    pub length: usize,
    pub stride: usize,
    pub block_size: usize,
    pub n: usize,
}

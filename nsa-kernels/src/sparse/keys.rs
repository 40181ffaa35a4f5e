//! What a sparse-attention call attends: the key set of each query row, and a selection's
//! inverted block index.

use burn::tensor::ops::IntTensor;
use burn::tensor::{backend::Backend, Int, Tensor};

use crate::sparse::documents::Documents;

/// Which keys each query row `t` attends. A window or a selection must give every row at least
/// one key (its own position is always among them in NSA).
///
/// With `documents` (packed rows, [`crate::Documents`]' `starts` `[B, T]`), a window or the
/// compressed blocks stop at the row's document start; a selection's lists hold only blocks of
/// the row's document already.
#[derive(Clone, Debug)]
pub enum Keys<B: Backend> {
    /// The causal window `[t + 1 - w, t]`.
    Window { w: usize, documents: Option<IntTensor<B>> },
    /// The union of blocks `[j * block_size, (j + 1) * block_size)` listed for the row, clamped
    /// causally to `t`. `blocks: [B, T, H_kv, n]`, shared by the query heads of a KV head;
    /// negative entries are unused slots. Listed blocks must be distinct. `index` is the
    /// backend's inverted index of `blocks` (`SparseAttentionBackend::block_index`), when
    /// one was built for them.
    Selected { blocks: IntTensor<B>, block_size: usize, index: Option<BlockIndex<B>> },
    /// The compressed branch's keys: `k` and `v` hold one row per compressed block
    /// (`[B, N, H_kv, d]`), block `i` summarising raw tokens `[i * stride, i * stride + length)`,
    /// and row `t` attends the blocks complete at `t` (`i * stride + length - 1 <= t`). A row
    /// that attends none outputs zeros and has no gradient; its log-sum-exp is `-1e30`.
    Compressed { length: usize, stride: usize, documents: Option<IntTensor<B>> },
}

impl<B: Backend> Keys<B> {
    /// The causal window of `w` keys, in each row's document with `documents`.
    pub fn window(w: usize, documents: Option<&Documents<B>>) -> Self {
        Keys::Window { w, documents: documents.map(Documents::primitive) }
    }

    /// The compressed blocks of `length` tokens every `stride`, of each row's document with
    /// `documents`.
    pub fn compressed(length: usize, stride: usize, documents: Option<&Documents<B>>) -> Self {
        Keys::Compressed { length, stride, documents: documents.map(Documents::primitive) }
    }

    /// Selected blocks from a tensor `[B, T, H_kv, n]`.
    pub fn selected(blocks: Tensor<B, 4, Int>, block_size: usize) -> Self {
        Keys::Selected { blocks: blocks.into_primitive(), block_size, index: None }
    }

    /// Where the key set runs: compressed keys on a path of their own, every other key set on the
    /// token kernels. Backends route once, here, so no lower layer receives a key set it cannot
    /// run.
    pub fn route(&self) -> Route<'_, B> {
        match self {
            Keys::Window { w, documents } => Route::Tokens(TokenKeys::Window { w: *w, documents: documents.as_ref() }),
            Keys::Selected { blocks, block_size, index } => {
                Route::Tokens(TokenKeys::Selected { blocks, block_size: *block_size, index: index.as_ref() })
            }
            Keys::Compressed { length, stride, documents } => {
                Route::Compressed { length: *length, stride: *stride, documents: documents.as_ref() }
            }
        }
    }
}

/// A key set routed ([`Keys::route`]).
pub enum Route<'a, B: Backend> {
    /// A window or a selection: the token kernels (the plan table's).
    Tokens(TokenKeys<'a, B>),
    /// The compressed blocks complete at each row (in its document, with `documents`).
    Compressed { length: usize, stride: usize, documents: Option<&'a IntTensor<B>> },
}

/// The key sets the token kernels run, borrowed from a [`Keys`]: a window, or selected blocks
/// (see [`Keys`]).
pub enum TokenKeys<'a, B: Backend> {
    Window { w: usize, documents: Option<&'a IntTensor<B>> },
    Selected { blocks: &'a IntTensor<B>, block_size: usize, index: Option<&'a BlockIndex<B>> },
}

// By hand: a derive would ask `B: Copy`, and only references and sizes are copied.
impl<B: Backend> Clone for TokenKeys<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend> Copy for TokenKeys<'_, B> {}

/// Which query rows listed each block of a selection, in whatever layout the backend's kernels
/// walk (the fused backends': u32 tensors in a fixed order). Built once per key set, so the
/// forward and the backward share it instead of each building its own.
#[derive(Clone, Debug)]
pub struct BlockIndex<B: Backend> {
    pub tensors: Vec<IntTensor<B>>,
}

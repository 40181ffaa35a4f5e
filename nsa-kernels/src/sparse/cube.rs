//! [`SparseAttentionBackend`] for `CubeBackend` (CUDA, WGPU): a window or selection chooses its
//! plans ([`crate::sparse::plan`]) from the problem and the device, and [`crate::sparse::launch`] runs them; the
//! compressed branch ([`compressed`]) runs as a window over its interleaved rows.

use burn::tensor::Shape;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{element::BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use crate::sparse::api::{Selection, SparseAttentionBackend, SparseAttentionGrads};
use crate::sparse::compressed;
use crate::sparse::keys::{BlockIndex, Keys, Route};
use crate::sparse::launch::index::InvertedIndex;
use crate::sparse::launch::{backward_with, capabilities, forward_with, problem};
use crate::sparse::plan::{BackwardPlan, ForwardPlan};

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> SparseAttentionBackend
    for CubeBackend<R, F, I, BT>
{
    fn has_fused_sparse_attention() -> bool {
        true
    }

    fn block_index(blocks: &CubeTensor<R>, block_size: usize) -> Option<BlockIndex<Self>> {
        let index = InvertedIndex::build(&into_contiguous(blocks.clone()), block_size);
        Some(BlockIndex { tensors: index.into_tensors() })
    }

    fn block_index_shapes(blocks: &Shape, block_size: usize) -> Option<Vec<Shape>> {
        Some(InvertedIndex::<R>::shapes(blocks, block_size))
    }

    fn select_blocks(
        q: CubeTensor<R>,
        k: CubeTensor<R>,
        lse: CubeTensor<R>,
        selection: Selection,
        documents: Option<CubeTensor<R>>,
    ) -> Option<CubeTensor<R>> {
        Some(crate::sparse::top_n::select_blocks(q, k, lse, selection, documents.as_ref(), I::dtype()))
    }

    fn sparse_attention(
        q: CubeTensor<R>,
        k: CubeTensor<R>,
        v: CubeTensor<R>,
        keys: &Keys<Self>,
    ) -> (CubeTensor<R>, CubeTensor<R>) {
        match keys.route() {
            Route::Compressed { length, stride, documents } => {
                compressed::forward::<R, F, I, BT>(q, k, v, length, stride, documents)
            }
            Route::Tokens(keys) => {
                let plan = ForwardPlan::choose(&problem(&q, &k, &v, keys), &capabilities(&q.client));
                forward_with(q, k, v, keys, &plan)
            }
        }
    }

    fn sparse_attention_backward(
        q: CubeTensor<R>,
        k: CubeTensor<R>,
        v: CubeTensor<R>,
        out: CubeTensor<R>,
        lse: CubeTensor<R>,
        grad_out: CubeTensor<R>,
        keys: &Keys<Self>,
    ) -> SparseAttentionGrads<Self> {
        match keys.route() {
            Route::Compressed { length, stride, documents } => {
                let [q, k, v] =
                    compressed::backward::<R, F, I, BT>(q, k, v, out, lse, grad_out, length, stride, documents);
                SparseAttentionGrads { q, k, v }
            }
            Route::Tokens(keys) => {
                let plan = BackwardPlan::choose(&problem(&q, &k, &v, keys), &capabilities(&q.client));
                backward_with(q, k, v, out, lse, grad_out, keys, &plan)
            }
        }
    }
}

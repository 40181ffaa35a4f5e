//! `Autodiff<B>`: the fused forward with the fused backward when `B` has them, else the
//! reference's tensor ops, which autodiff differentiates like any other.

use burn::backend::autodiff::{
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
    Autodiff, NodeId,
};
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::Shape;

use crate::sparse::api::{with_block_index, Selection, SparseAttentionBackend};
use crate::sparse::keys::{BlockIndex, Keys};

/// What the backward needs: the inputs (through the checkpointer), the output, its
/// log-sum-exp and the key set.
#[derive(Debug, Clone)]
struct SavedForward<B: SparseAttentionBackend> {
    q: NodeId,
    k: NodeId,
    v: NodeId,
    out: FloatTensor<B>,
    lse: FloatTensor<B>,
    keys: Keys<B>,
}

#[derive(Debug)]
struct SparseAttentionBackward;

impl<B: SparseAttentionBackend> Backward<B, 3> for SparseAttentionBackward {
    type State = SavedForward<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
        let [node_q, node_k, node_v] = ops.parents;
        let grad_out = grads.consume::<B>(&ops.node);
        let s = ops.state;
        let q = checkpointer.retrieve_node_output(s.q);
        let k = checkpointer.retrieve_node_output(s.k);
        let v = checkpointer.retrieve_node_output(s.v);
        let g = B::sparse_attention_backward(q, k, v, s.out, s.lse, grad_out, &s.keys);
        for (node, grad) in [(node_q, g.q), (node_k, g.k), (node_v, g.v)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

/// The key set of the inner backend (int tensors are not tracked, so they are the same).
fn inner_keys<B: SparseAttentionBackend, C: CheckpointStrategy>(keys: &Keys<Autodiff<B, C>>) -> Keys<B> {
    match keys {
        Keys::Window { w, documents } => Keys::Window { w: *w, documents: documents.clone() },
        Keys::Compressed { length, stride, documents } => {
            Keys::Compressed { length: *length, stride: *stride, documents: documents.clone() }
        }
        Keys::Selected { blocks, block_size, index } => Keys::Selected {
            blocks: blocks.clone(),
            block_size: *block_size,
            index: index.clone().map(|index| BlockIndex { tensors: index.tensors }),
        },
    }
}

impl<B: SparseAttentionBackend, C: CheckpointStrategy> SparseAttentionBackend for Autodiff<B, C> {
    fn has_fused_sparse_attention() -> bool {
        B::has_fused_sparse_attention()
    }

    fn block_index(blocks: &IntTensor<B>, block_size: usize) -> Option<BlockIndex<Self>> {
        B::block_index(blocks, block_size).map(|index| BlockIndex { tensors: index.tensors })
    }

    fn block_index_shapes(blocks: &Shape, block_size: usize) -> Option<Vec<Shape>> {
        B::block_index_shapes(blocks, block_size)
    }

    fn select_blocks(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        selection: Selection,
        documents: Option<IntTensor<Self>>,
    ) -> Option<IntTensor<Self>> {
        // Not differentiated, and int tensors are not tracked: the inner backend's, as they are.
        B::select_blocks(q.primitive, k.primitive, lse.primitive, selection, documents)
    }

    fn sparse_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        keys: &Keys<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        if !B::has_fused_sparse_attention() {
            return crate::sparse::reference::forward_primitive::<Self>(q, k, v, keys);
        }
        let inner = inner_keys(keys);
        // The log-sum-exp is returned untracked: it is a by-product, not differentiated.
        let prep = SparseAttentionBackward
            .prepare::<C>([q.node.clone(), k.node.clone(), v.node.clone()])
            .compute_bound()
            .stateful();
        match prep {
            OpsKind::Tracked(mut prep) => {
                let (qn, kn, vn) = (prep.checkpoint(&q), prep.checkpoint(&k), prep.checkpoint(&v));
                // One inverted index for the forward and the backward.
                let inner = with_block_index(inner);
                let (out, lse) = B::sparse_attention(q.primitive, k.primitive, v.primitive, &inner);
                let state = SavedForward { q: qn, k: kn, v: vn, out: out.clone(), lse: lse.clone(), keys: inner };
                (prep.finish(state, out), untracked::<B, C>(lse))
            }
            OpsKind::UnTracked(prep) => {
                let (out, lse) = B::sparse_attention(q.primitive, k.primitive, v.primitive, &inner);
                (prep.finish(out), untracked::<B, C>(lse))
            }
        }
    }
}

fn untracked<B: SparseAttentionBackend, C: CheckpointStrategy>(t: FloatTensor<B>) -> FloatTensor<Autodiff<B, C>> {
    <Autodiff<B, C> as burn::tensor::backend::AutodiffBackend>::from_inner(t)
}
